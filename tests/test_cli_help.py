"""What the command line says about itself: --version without importing torch, and --help's
numbers and units."""

import subprocess
import sys

import pytest

from helpers import OVERSUBSCRIPTION, STUCK_SLACK_S
from parascale.cli.main import main


def test_the_help_states_the_oversubscription_factor(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"more than {OVERSUBSCRIPTION} CPU threads per core" in text
    assert f"at most {STUCK_SLACK_S:g} s later" in text


@pytest.mark.slow
def test_version_is_printed_without_importing_torch():
    code = ("import sys\nfrom parascale.cli.main import main\n"
            "try:\n    main(['--version'])\nexcept SystemExit as exc:\n    code = exc.code\n"
            "print('torch' in sys.modules, 'matplotlib' in sys.modules, code)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    import parascale

    assert proc.stdout.splitlines() == [f"parascale {parascale.__version__}",
                                        "False False 0"], proc.stderr


def test_target_accuracy_help_says_it_is_a_fraction(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    help_text = text[text.rindex("--target-accuracy"):][:300]  # its help, after the usage
    assert "fraction" in help_text and "0.9 for 90 percent" in help_text, help_text
