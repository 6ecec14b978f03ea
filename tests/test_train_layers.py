"""The trainer's arrows point down: training/ imports nothing of the search (hpo/) and names no
synchronisation algorithm; what a strategy decides or shows, it does through its own hooks."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import parascale

TRAINING = Path(parascale.__file__).resolve().parent / "training"


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at load time or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_the_trainer_imports_nothing_of_the_search():
    upward = {str(f.relative_to(TRAINING)): sorted(m for m in _imports(f)
                                                   if m.startswith("parascale.hpo"))
              for f in TRAINING.rglob("*.py")}
    assert {name: found for name, found in upward.items() if found} == {}


def test_the_loop_and_its_state_name_no_strategy():
    # training/__init__.py (the launcher's side) is left out: it starts parameter servers
    named = {str(f.relative_to(TRAINING)):
             re.findall(r"\bsync\s*[!=]=\s*['\"][\w-]+['\"]", f.read_text())
             for f in TRAINING.rglob("*.py") if f.name != "__init__.py"}
    assert {name: found for name, found in named.items() if found} == {}
