"""The demo's plan, without running it: repeats in rounds across its weak and strong studies,
and the quick demo in a folder of its own."""


def test_repeats_run_in_rounds_across_the_demos_weak_and_strong_studies():
    from parascale.cli.demo_cmd import REPEAT, demo_jobs

    jobs = demo_jobs(quick=False)
    assert [j.repeat for j in jobs] == sorted(j.repeat for j in jobs), \
        [(j.scaling, j.repeat) for j in jobs]
    first = [j for j in jobs if j.repeat == 1]
    assert {j.scaling for j in first} == {"weak", "strong"}
    # every round runs the same configurations in the same order (ABAB...)
    rounds = [[j.config_id for j in jobs if j.repeat == k] for k in range(1, REPEAT + 1)]
    assert all(r == rounds[0] for r in rounds)


def test_the_quick_demo_has_a_folder_of_its_own():
    from parascale.cli.demo_cmd import default_folder

    assert default_folder(quick=True) != default_folder(quick=False)
