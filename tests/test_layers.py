"""How parascale's modules hang together: no import circles, one table of PARASCALE_* names.

Both read the source with ``ast`` and ``re`` (nothing is imported), so they are fast and fail
on the line that breaks the rule.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

from parascale.runtime import contract

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "parascale"


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(name: str, path: Path, known: dict[str, Path], types: bool = False) -> set[str]:
    """The parascale modules ``name`` imports, at the top or inside a function (a deferred
    import is still a dependency: it only hides the circle until the function runs); imports
    under ``if TYPE_CHECKING:`` are left out, as they never run, unless ``types``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test) \
                    and not types:
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names if a.name in known)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[:len(package.split(".")) - child.level + 1]
                    base = ".".join(up + ([child.module] if child.module else []))
                for alias in child.names:  # a submodule, or a name from the module
                    submodule = f"{base}.{alias.name}"
                    found.add(submodule if submodule in known else base)
            visit(child)

    visit(ast.parse(path.read_text()))
    return {m for m in found if m in known and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                connect(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return cycles


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_of_parascale_imports_itself_through_others():
    known = _modules()
    graph = {name: _imports(name, path, known) for name, path in known.items()}
    assert graph["parascale.training.loop.train"]  # the walk sees imports at all
    assert _cycles(graph) == []


def test_the_script_api_and_the_run_record_are_in_no_circle_even_for_types():
    # a circle through type hints alone still ties the modules together: neither can be
    # understood, or moved, without the other
    known = _modules()
    graph = {name: _imports(name, path, known, types=True) for name, path in known.items()}
    ours = ("parascale.script", "parascale.runrecord", "parascale.record",
            "parascale.training.launch.launcher", "parascale.training.record.assemble",
            "parascale.training.record.epochs")
    assert [c for c in _cycles(graph) if any(m.startswith(ours) for m in c)] == []


def test_no_module_imports_another_packages_underscore_names():
    known = _modules()
    found: dict[str, list[str]] = {}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or node.level or \
                    not (node.module or "").startswith("parascale"):
                continue
            source = node.module or ""
            home = source if known.get(source, Path()).name == "__init__.py" else \
                source.rpartition(".")[0]
            private = [a.name for a in node.names if a.name.startswith("_")
                       and not a.name.startswith("__")]
            if private and home != package:
                found.setdefault(str(path.relative_to(PACKAGE)), []).extend(private)
    # left for their owners: two plot modules borrowing the report's figure helpers
    assert found == {"hpo/plots.py": ["_figure", "_render"], "predict/plot.py": ["_worker_axis"]}


def test_every_parascale_variable_is_named_in_the_contract_alone():
    table = contract.names()
    literal = re.compile(r"""["'](PARASCALE_[A-Z0-9_]*)""")
    elsewhere = [f"{path.relative_to(SRC)}:{number}: {match.group(1)}"
                 for path in sorted(PACKAGE.rglob("*.py")) if path.name != "contract.py"
                 for number, line in enumerate(path.read_text().splitlines(), 1)
                 for match in literal.finditer(line)]
    assert elsewhere == [], "spell these as parascale.runtime.contract names"
    assert len(set(table.values())) == len(table)  # no variable named twice
    # every entry is read or written somewhere: the table lists no dead names
    source = "\n".join(p.read_text() for p in PACKAGE.rglob("*.py") if p.name != "contract.py")
    unused = [key for key in table if not re.search(rf"contract\.{key}\b", source)]
    assert unused == []
