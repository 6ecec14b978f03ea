"""How parascale's modules hang together: the layers of docs/design.md (every import goes down
or across a row, never up), no import circles (type-only imports count), no module taking
another module's underscore names, and one table of PARASCALE_* names.

They read the source with ``ast`` and ``re`` (nothing is imported), so they are fast and fail
on the line that breaks the rule.
"""
from __future__ import annotations

import ast
import fnmatch
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


def _imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The parascale modules ``name`` imports, at the top, inside a function (a deferred import
    is still a dependency: it only hides the circle until the function runs) or under ``if
    TYPE_CHECKING:`` (a module needed to read another's types is needed all the same)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            for alias in node.names:  # a submodule, or a name from the module
                submodule = f"{base}.{alias.name}"
                found.add(submodule if submodule in known else base)
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


DESIGN = SRC.parent / "docs" / "design.md"


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def _graph() -> dict[str, set[str]]:
    """Every module's parascale imports, type-only ones included: a circle through type hints
    alone still ties the modules together (neither can be understood, or moved, without the
    other), and an import for a type is an arrow like any other."""
    known = _modules()
    return {name: _imports(name, path, known) for name, path in known.items()}


def test_no_module_of_parascale_imports_itself_through_others():
    graph = _graph()
    assert graph["parascale.training.loop.train"]  # the walk sees imports at all
    # and type-only ones (trained.py imports under TYPE_CHECKING alone)
    assert "parascale.training.record.progress" in graph["parascale.training.checkpoint.trained"]
    assert _cycles(graph) == []


# --- the layers of docs/design.md ---------------------------------------------------------


class Layers:
    """The table of docs/design.md's Layers section: rows from the top down, each a list of
    units (a package, a part of one, a top-level module; ``cli.*_cmd`` a pattern), and the
    rows marked *apart*, whose units import none of each other."""

    def __init__(self, text: str):
        section = text[text.index("## Layers"):]
        block = section[section.index("```\n") + 4:]
        lines = block[:block.index("```")].splitlines()
        rule = next(i for i, line in enumerate(lines) if set(line) <= {"-", " "} and line)
        spans = [m.span() for m in re.finditer(r"-+", lines[rule])]
        self.rows: list[list[str]] = []
        self.apart: set[int] = set()
        for line in lines[rule + 1:]:
            name, units, what = (line[a:b if i + 1 < len(spans) else None].strip()
                                 for i, (a, b) in enumerate(spans))
            if name:
                self.rows.append([])
                if what.startswith("apart"):
                    self.apart.add(len(self.rows) - 1)
            self.rows[-1].extend(units.split())

    def unit(self, module: str) -> str | None:
        """The table's unit that holds ``module`` (the longest prefix that names or matches
        one), or None."""
        name = module.removeprefix("parascale.") if module != "parascale" else "parascale"
        parts = name.split(".")
        for n in range(len(parts), 0, -1):
            prefix = ".".join(parts[:n])
            for unit in (u for row in self.rows for u in row):
                if fnmatch.fnmatchcase(prefix, unit):
                    return prefix if "*" in unit else unit
        return None

    def row(self, unit: str) -> int:
        return next(i for i, row in enumerate(self.rows)
                    if any(fnmatch.fnmatchcase(unit, u) for u in row))


def _layers() -> Layers:
    return Layers(DESIGN.read_text())


def test_the_layer_table_reads_rows_continuations_and_apart_rows():
    layers = Layers("## Layers\n```\nlayer  units    what\n-----  -------  ----\n"
                    "top    a.*_cmd  apart: x\nlow    b c      y\n       d\n```\n")
    assert layers.rows == [["a.*_cmd"], ["b", "c", "d"]] and layers.apart == {0}
    assert layers.unit("parascale.a.run_cmd") == "a.run_cmd"
    assert layers.unit("parascale.d.deep.module") == "d" and layers.unit("parascale.e") is None
    assert layers.row("a.run_cmd") == 0 and layers.row("d") == 1


def test_the_layer_table_names_every_package_and_module_once_and_nothing_else():
    layers = _layers()
    known = _modules()
    missing = sorted(m for m in known if layers.unit(m) is None)
    assert missing == [], "add these to the table in docs/design.md's Layers section"
    units = [u for row in layers.rows for u in row]
    assert len(units) == len(set(units))
    matched = {u for u in units if any(fnmatch.fnmatchcase(layers.unit(m) or "", u)
                                       for m in known)}
    assert sorted(set(units) - matched) == [], "the table names units no module has"


def _arrows_up(layers: Layers, graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, imported in graph.items():
        mine = layers.unit(module)
        for other in sorted(imported):
            theirs = layers.unit(other)
            if mine is None or theirs is None or mine == theirs:
                continue
            up, down = layers.row(mine), layers.row(theirs)
            if down < up or (down == up and up in layers.apart):
                found.append(f"{module} -> {other}")
    return found


def test_every_import_goes_down_or_across_its_row_never_up():
    layers = _layers()
    graph = _graph()
    assert _arrows_up(layers, graph) == []
    # the check sees an arrow up, and one across an apart row
    assert _arrows_up(layers, {"parascale.runtime.world": {"parascale.training.loop.step"},
                               "parascale.cli.run_cmd": {"parascale.cli.train_cmd"},
                               "parascale.cli.run_cmd.x": {"parascale.cli.options"}}) == [
        "parascale.runtime.world -> parascale.training.loop.step",
        "parascale.cli.run_cmd -> parascale.cli.train_cmd"]


def test_no_two_units_import_each_other_through_others():
    # sideways within a row is allowed, a circle between units is not: units are what moves
    layers = _layers()
    units: dict[str, set[str]] = {}
    for module, imported in _graph().items():
        mine = layers.unit(module) or module
        units.setdefault(mine, set()).update(
            u for u in (layers.unit(m) or m for m in imported) if u != mine)
    assert _cycles(units) == []


# --- private names ------------------------------------------------------------------------


def _private_uses(name: str, path: Path, known: dict[str, Path]) -> list[str]:
    """Another parascale module's underscore names that module ``name`` takes: imported by
    name (``from m import _x``) or reached through the module (``m._x``, also after
    ``import m as y`` or ``from package import m``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    modules: dict[str, str] = {}  # a local name bound to a parascale module -> the module
    found = []

    def private(text: str) -> bool:
        return text.startswith("_") and not text.startswith("__")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    modules[alias.asname or alias.name.partition(".")[0]] = \
                        alias.name if alias.asname else alias.name.partition(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    modules[alias.asname or alias.name] = f"{base}.{alias.name}"
                elif private(alias.name) and base in known and base != name:
                    found.append(f"{base}.{alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            chain, value = [], node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in modules:
                module = ".".join([modules[value.id], *reversed(chain)])
                if module in known and module != name:
                    found.append(f"{module}.{node.attr}")
    return found


def test_the_private_name_finder_sees_every_form(tmp_path):
    code = ("import parascale.a as y\nfrom parascale import b\nfrom parascale.c import _x\n"
            "y._one, b._two, b.public, y.__doc__\n")
    (tmp_path / "m.py").write_text(code)
    known = {f"parascale.{n}": Path(f"{n}.py") for n in ("a", "b", "c")}
    assert _private_uses("parascale.m", tmp_path / "m.py", known) == [
        "parascale.c._x", "parascale.a._one", "parascale.b._two"]


def test_no_module_takes_another_modules_underscore_names():
    known = _modules()
    found = {name: uses for name, path in known.items()
             if (uses := _private_uses(name, path, known))}
    assert found == {}


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
