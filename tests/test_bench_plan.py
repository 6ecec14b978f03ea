"""The study planner: products, references, computed values, extensions, ids, files, CLI values."""
from __future__ import annotations

import re

import pytest

from parascale.bench.plan import (PlanError, PlannedRun, build_plan, format_plan_table,
                                  parse_workers, scaling_configs)
from parascale.bench.studyfile import load_study_file
from parascale.bench.values import parse_assignment, parse_variable
from parascale.errors import UsageError


def only(runs: list[PlannedRun]) -> dict:
    assert len(runs) == 1
    return runs[0].params


# --- products ------------------------------------------------------------------------------------

def test_product_count_and_order_first_variable_slowest():
    runs = build_plan({"epochs": 1}, {"model": ["a", "b"], "workers": [1, 2, 4]})
    assert len(runs) == 6
    assert [(r.params["model"], r.params["workers"]) for r in runs] == [
        ("a", 1), ("a", 2), ("a", 4), ("b", 1), ("b", 2), ("b", 4)]
    assert all(r.params["epochs"] == 1 and r.skip_reason is None for r in runs)


def test_no_variables_gives_one_run():
    assert only(build_plan({"a": 1}, {})) == {"a": 1}


def test_variable_overrides_parameter_of_the_same_name():
    assert [r.params["a"] for r in build_plan({"a": 1}, {"a": [2, 3]})] == [2, 3]


def test_empty_or_scalar_variable_is_an_error():
    with pytest.raises(PlanError, match="non-empty list"):
        build_plan({}, {"a": []})
    with pytest.raises(PlanError, match="non-empty list"):
        build_plan({}, {"a": "1,2"})


def test_duplicate_configurations_appear_once():
    runs = build_plan({}, {"a": [1, 1, 2]})
    assert [r.params["a"] for r in runs] == [1, 2]


# --- references ----------------------------------------------------------------------------------

def test_whole_reference_keeps_the_type():
    params = only(build_plan({"a": 32, "b": "${a}", "c": "${ b }", "f": 0.5, "g": "${f}"}, {}))
    assert params["b"] == 32 and params["c"] == 32 and params["g"] == 0.5


def test_embedded_reference_is_text_and_nested_references_resolve():
    params = only(build_plan({
        "root": "/runs", "name": "${model}_${n}", "log": "${root}/${name}.log",
        "model": "mlp", "n": 4, "flag": True, "msg": "flag=${flag}",
    }, {}))
    assert params["log"] == "/runs/mlp_4.log"
    assert params["msg"] == "flag=true"


def test_references_inside_lists_are_resolved():
    assert only(build_plan({"a": 2, "b": ["${a}", "x${a}"]}, {}))["b"] == [2, "x2"]


def test_variables_may_hold_references():
    runs = build_plan({"base": 8}, {"batch": ["${base}", "= base * 2"]})
    assert [r.params["batch"] for r in runs] == [8, 16]


# --- computed values -----------------------------------------------------------------------------

@pytest.mark.parametrize("value", [
    "= ${global_batch} // ${workers}",
    "=global_batch // workers",
    "$( ${global_batch} // ${workers} )$",
    "$(global_batch//workers)$",
])
def test_computed_values_both_syntaxes(value):
    params = only(build_plan({"global_batch": 256, "workers": 4, "per": value}, {}))
    assert params["per"] == 64


def test_dlbs_style_expression_with_string_literal_reference():
    params = only(build_plan({
        "gpus": 2, "device": "$('gpu' if ${gpus} > 0 else 'cpu')$",
        "effective": "$(${gpus} * 16 if '${device}' == 'gpu' else 16)$",
    }, {}))
    assert params["device"] == "gpu" and params["effective"] == 32


def test_computed_tuples_become_lists():
    assert only(build_plan({"a": "= (1, 2)"}, {}))["a"] == [1, 2]


def test_computed_value_must_be_the_whole_string():
    with pytest.raises(PlanError, match="whole string"):
        build_plan({"a": "x_$(1 + 1)$"}, {})


def test_unsafe_expression_is_a_plan_error_naming_the_parameter():
    with pytest.raises(PlanError, match=r"parameter 'a'.*not allowed.*attribute access"):
        build_plan({"a": "= ().__class__"}, {})


def test_failing_expression_is_a_plan_error():
    with pytest.raises(PlanError, match=r"parameter 'a'.*division by zero"):
        build_plan({"a": "= 1 / 0"}, {})


# --- errors at plan time -------------------------------------------------------------------------

def test_two_cycle_is_reported_with_its_chain():
    with pytest.raises(PlanError, match=r"reference cycle: a -> b -> a"):
        build_plan({"a": "${b}", "b": "x${a}"}, {})


def test_self_reference_is_a_cycle():
    with pytest.raises(PlanError, match=r"reference cycle: a -> a"):
        build_plan({"a": "= a + 1"}, {})


def test_longer_cycle_through_expressions():
    with pytest.raises(PlanError, match=r"reference cycle: (a -> b -> c -> a|b -> c -> a -> b)"):
        build_plan({"a": "= b", "b": "${c}", "c": "= ${a} * 2"}, {})


def test_unknown_name_lists_known_names():
    with pytest.raises(PlanError, match=r"unknown name 'wokers'.*known names: a, log, workers"):
        build_plan({"a": 1, "log": "run_${wokers}.log"}, {"workers": [1]})


def test_unknown_name_in_expression():
    with pytest.raises(PlanError, match=r"parameter 'b' refers to unknown name 'zz'"):
        build_plan({"b": "= zz + 1"}, {})


def test_malformed_reference_and_bad_names():
    with pytest.raises(PlanError, match="malformed reference"):
        build_plan({"a": "${a.b}"}, {})
    with pytest.raises(PlanError, match="bad parameter name"):
        build_plan({"bad-name": 1}, {})
    with pytest.raises(PlanError, match="bad variable name"):
        build_plan({}, {"__x": [1]})


def test_plan_error_is_a_usage_error():
    assert issubclass(PlanError, UsageError)


# --- extensions ----------------------------------------------------------------------------------

def test_extension_merges_parameters_when_condition_holds():
    runs = build_plan({"lr": 0.1}, {"model": ["mlp", "cnn"]}, [
        {"condition": "model == 'cnn'", "parameters": {"lr": 0.01, "note": "${model}-tuned"}},
    ])
    assert runs[0].params == {"lr": 0.1, "model": "mlp"}
    assert runs[1].params == {"lr": 0.01, "model": "cnn", "note": "cnn-tuned"}


def test_extension_without_condition_always_applies_and_changes_dependants():
    params = only(build_plan({"b": 8, "g": "= b * 2"}, {}, [{"parameters": {"b": 16}}]))
    assert params == {"b": 16, "g": 32}


def test_extensions_apply_in_order_and_see_earlier_results():
    params = only(build_plan({"a": 1}, {}, [
        {"parameters": {"b": "= a + 1"}},
        {"condition": "$( ${b} == 2 )$", "parameters": {"c": "ok"}},
    ]))
    assert params["c"] == "ok"


def test_cases_fork_each_matching_configuration():
    runs = build_plan({}, {"model": ["mlp", "cnn"]}, [
        {"condition": "model == 'cnn'", "cases": [{"opt": "sgd"}, {"opt": "adam", "lr": 0.001}]},
    ])
    assert [(r.params["model"], r.params.get("opt")) for r in runs] == [
        ("mlp", None), ("cnn", "sgd"), ("cnn", "adam")]
    assert runs[2].params["lr"] == 0.001
    assert "opt-adam" in runs[2].config_id


def test_skip_keeps_the_run_with_a_resolved_reason():
    runs = build_plan({"global_batch": 100}, {"workers": [1, 3, 4]}, [
        {"condition": "global_batch % workers != 0",
         "skip": "global batch ${global_batch} does not divide by ${workers} workers"},
    ])
    assert len(runs) == 3
    assert [r.skip_reason for r in runs] == [
        None, "global batch 100 does not divide by 3 workers", None]


def test_condition_with_unknown_name_is_a_plan_error():
    with pytest.raises(PlanError, match=r"extension 1 condition refers to unknown name 'nope'"):
        build_plan({"a": 1}, {}, [{"condition": "nope > 1", "parameters": {"b": 1}}])


@pytest.mark.parametrize("ext, message", [
    ({"when": "a"}, "unknown key"),
    ({"cases": []}, "non-empty list"),
    ({"cases": [1]}, "non-empty list"),
    ({"parameters": [1]}, "mapping"),
    ({"skip": 3}, "reason string"),
    ({"condition": 3}, "expression string"),
    ("a", "must be a mapping"),
])
def test_bad_extensions_are_reported(ext, message):
    with pytest.raises(PlanError, match=message):
        build_plan({"a": 1}, {}, [ext])


# --- config ids ----------------------------------------------------------------------------------

def test_config_id_is_readable_stable_and_unique():
    def plan():
        return build_plan({"lr": "= 0.1 / workers", "path": "/a b/${model}"},
                          {"model": ["res/net", "mlp"], "workers": [1, 2]})

    first, second = plan(), plan()
    ids = [r.config_id for r in first]
    assert ids == [r.config_id for r in second]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"[A-Za-z0-9._+-]+", i) for i in ids)
    assert re.fullmatch(r"model-res_net__workers-1__[0-9a-f]{8}", ids[0])


def test_config_id_depends_on_all_params():
    a = build_plan({"x": 1}, {"w": [1]})[0].config_id
    b = build_plan({"x": 2}, {"w": [1]})[0].config_id
    assert a != b and a.startswith("w-1__") and b.startswith("w-1__")


def test_config_id_without_variables():
    assert re.fullmatch(r"run__[0-9a-f]{8}", build_plan({"a": 1}, {})[0].config_id)


def test_planned_run_is_frozen():
    run = build_plan({"a": 1}, {})[0]
    with pytest.raises(AttributeError):
        run.config_id = "x"  # type: ignore[misc]


# --- scaling helpers -----------------------------------------------------------------------------

@pytest.mark.parametrize("spec, max_workers, expected", [
    ("1,2,4", 8, [1, 2, 4]),
    (" 4, 1 ", 8, [4, 1]),
    ("pow2", 8, [1, 2, 4, 8]),
    ("pow2", 6, [1, 2, 4]),
    ("pow2:4", 16, [1, 2, 4]),
    ("POW2:1", 16, [1]),
    ("all", 6, [6]),
    ("1-4", 8, [1, 2, 3, 4]),
    ("1,2,6-8", 8, [1, 2, 6, 7, 8]),
    ("2,2,1-2", 8, [2, 1]),
])
def test_parse_workers(spec, max_workers, expected):
    assert parse_workers(spec, max_workers) == expected


@pytest.mark.parametrize("spec", ["", "0", "a", "1,,2", "4-1", "pow3", "pow2:x", "pow2:0", "-1"])
def test_parse_workers_rejects_bad_specs_listing_the_forms(spec):
    with pytest.raises(PlanError, match="accepted forms"):
        parse_workers(spec, 8)


@pytest.mark.parametrize("spec", ["16", "1-9", "pow2:16"])
def test_parse_workers_rejects_more_than_available(spec):
    with pytest.raises(PlanError, match="at most 8"):
        parse_workers(spec, 8)


def test_weak_scaling_keeps_per_device_batch():
    assert scaling_configs("weak", [1, 2, 4], batch_size=32) == [
        (1, 32, 32, None), (2, 32, 64, None), (4, 32, 128, None)]


def test_strong_scaling_splits_global_batch_and_skips_non_dividing():
    assert scaling_configs("strong", [1, 2, 3, 4], global_batch=100) == [
        (1, 100, 100, None), (2, 50, 100, None),
        (3, None, 100, "global batch 100 does not divide by 3 workers"), (4, 25, 100, None)]


@pytest.mark.parametrize("mode, kwargs, message", [
    ("weak", {}, "give batch_size"),
    ("weak", {"global_batch": 64}, "give batch_size, not global_batch"),
    ("weak", {"batch_size": 8, "global_batch": 64}, "give batch_size, not global_batch"),
    ("strong", {}, "give global_batch"),
    ("strong", {"batch_size": 8}, "give global_batch, not batch_size"),
    ("strong", {"batch_size": 8, "global_batch": 64}, "give global_batch, not batch_size"),
    ("linear", {"batch_size": 8}, "'weak' or 'strong'"),
    ("weak", {"batch_size": 0}, "positive integer"),
])
def test_scaling_configs_errors(mode, kwargs, message):
    with pytest.raises(PlanError, match=message):
        scaling_configs(mode, [1, 2], **kwargs)


# --- command-line values -------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("batch=32", ("batch", 32)),
    ("lr=1e-3", ("lr", 0.001)),
    ("lr=0.5", ("lr", 0.5)),
    ("flag=true", ("flag", True)),
    ("flag=False", ("flag", False)),
    ("x=null", ("x", None)),
    ("model=resnet18", ("model", "resnet18")),
    ("model=\"32\"", ("model", "32")),
    ("log=${root}/x.log", ("log", "${root}/x.log")),
    ("per=$(${gb} // ${n})$", ("per", "$(${gb} // ${n})$")),
    ("per== gb // n", ("per", "= gb // n")),
    ("sizes=[1, 2]", ("sizes", [1, 2])),
    ("empty=", ("empty", "")),
])
def test_parse_assignment(text, expected):
    assert parse_assignment(text) == expected


@pytest.mark.parametrize("text", ["novalue", "=3", "1x=3", "a b=3", "x=[1,"])
def test_parse_assignment_errors_name_the_text(text):
    with pytest.raises(PlanError, match=re.escape(repr(text))):
        parse_assignment(text)


@pytest.mark.parametrize("text, expected", [
    ("workers=1,2,4", ("workers", [1, 2, 4])),
    ("model=mlp, cnn", ("model", ["mlp", "cnn"])),
    ("x=[1, \"a\", true]", ("x", [1, "a", True])),
    ("x=5", ("x", [5])),
    ("b=$(max(1, 2))$,3", ("b", ["$(max(1, 2))$", 3])),
])
def test_parse_variable(text, expected):
    assert parse_variable(text) == expected


@pytest.mark.parametrize("text, message", [
    ("workers", "expected name=v1,v2"),
    ("w=1,,2", "empty value"),
    ("w=[]", "at least one value"),
    ("w=[1,", "invalid JSON list"),
    ("w=", "empty value"),
])
def test_parse_variable_errors(text, message):
    with pytest.raises(PlanError, match=message):
        parse_variable(text)


# --- study files ---------------------------------------------------------------------------------

YAML_STUDY = """\
parameters:
  global_batch: 128
  per_device: "= ${global_batch} // ${workers}"
variables:
  workers: [1, 2, 3]
extensions:
  - condition: global_batch % workers != 0
    skip: "does not divide by ${workers}"
"""

TOML_STUDY = """\
[parameters]
global_batch = 128
per_device = "$( ${global_batch} // ${workers} )$"

[variables]
workers = [1, 2, 3]

[[extensions]]
condition = "global_batch % workers != 0"
skip = "does not divide by ${workers}"
"""


@pytest.mark.parametrize("name, text", [("s.yaml", YAML_STUDY), ("s.yml", YAML_STUDY),
                                        ("s.toml", TOML_STUDY)])
def test_study_files_plan_the_same(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    study = load_study_file(path)
    assert set(study) == {"parameters", "variables", "extensions"}
    runs = build_plan(study["parameters"], study["variables"], study["extensions"])
    assert [(r.params["per_device"], r.skip_reason) for r in runs] == [
        (128, None), (64, None), (42, "does not divide by 3")]


def test_empty_yaml_file_is_an_empty_study(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert load_study_file(path) == {"parameters": {}, "variables": {}, "extensions": []}


def test_unknown_top_level_key_lists_accepted(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("params: {a: 1}\n")
    with pytest.raises(PlanError, match=r"unknown key\(s\) params; accepted: parameters, "
                                        r"variables, extensions"):
        load_study_file(path)


def test_missing_file_and_bad_suffix(tmp_path):
    with pytest.raises(PlanError, match="nope.yaml.*does not exist"):
        load_study_file(tmp_path / "nope.yaml")
    with pytest.raises(PlanError, match=r"\.yaml, \.yml or \.toml"):
        load_study_file(tmp_path / "study.json")


def test_yaml_parse_error_names_file_and_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("parameters:\n  a: 1\n  b: [1, 2\n")
    with pytest.raises(PlanError, match=r"bad\.yaml.* at line \d+"):
        load_study_file(path)


def test_toml_parse_error_names_file_and_line(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[parameters]\na = \n")
    with pytest.raises(PlanError, match=r"bad\.toml.*line 2"):
        load_study_file(path)


def test_wrong_section_types(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("extensions: {a: 1}\n")
    with pytest.raises(PlanError, match="extensions must be a list"):
        load_study_file(path)
    path.write_text("- 1\n- 2\n")
    with pytest.raises(PlanError, match="must be a mapping"):
        load_study_file(path)


# --- dry-run table -------------------------------------------------------------------------------

def test_plan_table_shows_varying_parameters_and_status():
    runs = build_plan({"global_batch": 100, "per": "= global_batch // workers"},
                      {"workers": [1, 3]},
                      [{"condition": "global_batch % workers", "skip": "uneven"}])
    table = format_plan_table(runs)
    lines = table.splitlines()
    assert lines[0].split() == ["config", "per", "workers", "status"]
    assert "global_batch" not in table  # constant across the plan
    assert runs[0].config_id in lines[2] and lines[2].endswith("planned")
    assert runs[1].config_id in lines[3] and lines[3].endswith("skipped: uneven")
    assert lines[-1] == "2 runs: 1 planned, 1 skipped"


def test_plan_table_for_empty_plan():
    assert "empty" in format_plan_table([])


def test_long_reference_chains_resolve_and_too_long_ones_fail_clearly():
    chain = {f"a{i}": f"${{a{i + 1}}}" for i in range(50)} | {"a50": 7}
    assert only(build_plan(chain, {}))["a0"] == 7
    chain = {f"a{i}": f"${{a{i + 1}}}" for i in range(500)} | {"a500": 7}
    with pytest.raises(PlanError, match="nested more than"):
        build_plan(chain, {})
