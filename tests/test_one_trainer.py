"""``parascale train`` and ``parascale run`` share one launch routine and one record builder,
and the script API is an adapter over them: read from the source with ``ast`` (nothing is
imported), so that a second launcher or a record assembled by hand fails here, on its line."""
from __future__ import annotations

import ast
from pathlib import Path

import parascale

SRC = Path(parascale.__file__).resolve().parent


def _trees() -> dict[str, ast.Module]:
    return {str(p.relative_to(SRC)): ast.parse(p.read_text()) for p in sorted(SRC.rglob("*.py"))}


def _imported(tree: ast.Module) -> dict[str, str]:
    """Each name a module imports from a parascale module: name -> module."""
    return {alias.asname or alias.name: node.module for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module
            and node.module.startswith("parascale") for alias in node.names}


RUNTIME = "parascale.runtime"


def _calls(tree: ast.Module, names: set[str]) -> set[str]:
    """The ``names`` a module calls, bare or as an attribute (``staging.produce(...)``)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else \
                func.attr if isinstance(func, ast.Attribute) else None
            if name in names:
                found.add(name)
    return found


def test_one_module_launches_training_workers_and_stages_their_results():
    callers: dict[str, set[str]] = {}
    for name, tree in _trees().items():
        imported = _imported(tree)
        # runtime's own names, bare (from parascale.runtime import launch) or through a module
        # of it (staging.produce)
        bare = {n for n in ("launch", "produce") if imported.get(n, "").startswith(RUNTIME)}
        modules = {n for n, m in imported.items() if f"{m}.{n}".startswith(RUNTIME)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Name) and func.id in bare or \
                    isinstance(func, ast.Attribute) and func.attr in ("launch", "produce") \
                    and isinstance(func.value, ast.Name) and func.value.id in modules:
                callers.setdefault(name, set()).add(ast.unparse(func).rpartition(".")[2])
    # parascale comm's workers measure the links; they train nothing
    assert callers == {"training/launch/launcher.py": {"launch", "produce"},
                       "comm/measure.py": {"launch", "produce"}}


def test_only_the_record_builder_makes_a_run_record():
    makers: dict[str, list[str]] = {}
    for name, tree in _trees().items():
        imported = _imported(tree)
        schema = {n for n, m in imported.items() if m == "parascale.record" and n == "SCHEMA"}
        records = {n for n, m in imported.items() if m == "parascale" and n in ("record",)} | \
            {n for n in imported if n == "rec"}
        for node in ast.walk(tree):
            made = None
            if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)):
                called = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
                if called in ("Record", "RunSummary"):
                    made = called
            if isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values):
                    if isinstance(key, ast.Constant) and key.value == "schema" and (
                            isinstance(value, ast.Name) and value.id in schema or
                            isinstance(value, ast.Attribute) and value.attr == "SCHEMA"
                            and isinstance(value.value, ast.Name)
                            and value.value.id in records):
                        made = "a dict with the run record's schema"
            if made:
                makers.setdefault(name, []).append(made)
    assert set(makers) == {"runrecord.py", "training/record/assemble.py"}
    # its figures, handed to finished()
    assert makers["training/record/assemble.py"] == ["RunSummary"]
    assert "Record" in makers["runrecord.py"]


def test_the_epoch_entry_is_made_in_one_place_for_train_and_run():
    made = {name for name, tree in _trees().items() for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "EpochEntry"}
    # and EpochEntry.from_dict, a classmethod (cls(...))
    assert made == {"training/record/epochs.py"}
    users = {name for name, tree in _trees().items() if "epoch_entry" in _calls(tree, {"epoch_entry"})}
    assert users == {"training/loop/step.py", "script/api.py"}
