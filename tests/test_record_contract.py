"""The record module is the one home of the record contract, and nothing imports in a circle."""
from __future__ import annotations

import ast
import json
import tomllib
from pathlib import Path

import pytest

import parascale
from parascale import record
from parascale.runrecord import failed
from parascale.safejson import Refused

PACKAGE = Path(parascale.__file__).resolve().parent


def _module_imports(path: Path) -> set[str]:
    """parascale modules a file imports when it is loaded (imports inside functions excluded)."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:  # ``from parascale import record`` imports the module
                sub = f"{node.module}.{alias.name}"
                found.add(sub if _file(sub) else node.module)
    return {name for name in found if name.startswith("parascale") and _file(name)}


def _file(module: str) -> Path | None:
    base = PACKAGE.parent.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _name(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")


def test_no_module_imports_itself_through_others_at_load_time():
    graph = {_name(f): _module_imports(f) for f in PACKAGE.rglob("*.py")}
    for start in graph:
        seen, todo = set(), list(graph[start])
        while todo:
            name = todo.pop()
            assert name != start, f"{start} imports itself through {sorted(seen)}"
            if name not in seen:
                seen.add(name)
                todo.extend(graph.get(name, ()))


def test_the_record_module_stands_on_the_ground_floor():
    # anything may import it, so it may import only what imports nothing of parascale's layers
    assert _module_imports(PACKAGE / "record.py") <= {"parascale.files", "parascale.safejson"}
    assert _module_imports(PACKAGE / "safejson.py") == set()
    assert "torch" not in {n.names[0].name for n in ast.parse((PACKAGE / "record.py").read_text()).body
                           if isinstance(n, ast.Import)}


def test_one_version_for_package_metadata_and_records():
    project = tomllib.loads((PACKAGE.parents[1] / "pyproject.toml").read_text())["project"]
    assert parascale.__version__ == record.VERSION == project["version"]


def test_a_failure_record_reads_back_and_claims_no_success(tmp_path):
    path = record.write(tmp_path, failed({"workers": 2}, "oom", "out of memory", None).to_dict())
    assert path.name == record.RECORD_NAME
    data = record.read_record(path)
    assert (data["schema"], data["status"], data["summary"]) == (record.SCHEMA, "oom", None)


@pytest.mark.parametrize("change, words", [
    ({"schema": "parascale.run/2"}, "is not supported"),
    ({"schema": record.COMM_SCHEMA}, "not a parascale run record"),
    ({"status": "fine"}, "unknown status 'fine'"),
    ({"config": {"workers": "two"}}, "config.workers is str"),
])
def test_a_record_outside_the_contract_is_refused_with_the_reason(tmp_path, change, words):
    data = {**failed({}, "failed", "x", None).to_dict(), **change}
    (tmp_path / record.RECORD_NAME).write_text(json.dumps(data))
    with pytest.raises(Refused, match=words) as caught:
        record.read_record(tmp_path / record.RECORD_NAME)
    assert caught.value.kind == "invalid"


def test_every_status_the_contract_names_is_readable(tmp_path):
    for status in record.STATUSES:
        record.write(tmp_path, failed({}, status, "x", None).to_dict())
        assert record.read_record(tmp_path / record.RECORD_NAME)["status"] == status
