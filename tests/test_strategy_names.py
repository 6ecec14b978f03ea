"""No package but ``sync`` names a strategy: the others ask the registry (issue 31).

The source is read as tokens (nothing is imported): a string that names a registered strategy,
outside ``src/parascale/sync/`` and outside docstrings, fails with its file and line. A name
that is also an English word or another thing's name (``none``: no learning-rate scaling or
compression; ``allreduce``: a collective of ``parascale comm``) is flagged only where the line
speaks of the strategy (``sync``), or as ``--sync NAME`` in a message.
"""
from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

from parascale import sync

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "parascale"
#: names that mean other things too, or are English words
AMBIGUOUS = {"none", "allreduce", "zero"}


def _strings(source: str) -> list[tuple[int, str, str]]:
    """(line, the string's text, its whole line) of every string literal but docstrings."""
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            docstrings.add(body[0].value.lineno)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str):  # an attribute's docstring
            docstrings.add(node.value.lineno)
    lines = source.splitlines()
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        kind = getattr(tokenize, "FSTRING_START", None)
        if token.type == tokenize.STRING and token.start[0] not in docstrings:
            found.append((token.start[0], token.string, lines[token.start[0] - 1]))
        elif kind is not None and token.type == kind:
            found.append((token.start[0], token.line, lines[token.start[0] - 1]))
    return found


def naming(text: str, line: str, names: list[str]) -> list[str]:
    """The strategy names a string literal ``text`` (as written, quotes included) spells."""
    # the literal's prefix (r, b, f, u) and quotes only: str.strip would also take a name's
    # own first or last letters ("reduce-broadcast", "fsdp", "parameter-server")
    quoted = re.fullmatch(r"[rRbBfFuU]*(\"\"\"|\'\'\'|\"|\')(.*)\1", text, re.S)
    body = quoted.group(2) if quoted else text
    said = []
    for name in names:
        word = re.escape(name)
        if re.search(rf"--sync[ =]{word}\b", body) or re.search(rf"sync={word}\b", body):
            said.append(name)
        elif body == name and (name not in AMBIGUOUS or "sync" in line.lower()):
            said.append(name)
        elif name not in AMBIGUOUS and re.search(rf"(?<![\w./-]){word}(?![\w-]|\.py)", body):
            said.append(name)
    return said


def test_the_finder_sees_how_a_strategy_is_named():
    names = ["allreduce", "local-sgd", "none"]
    assert naming('"local-sgd"', "x = 'local-sgd'", names) == ["local-sgd"]
    assert naming('"allreduce"', 'if cfg.strategy.sync == "allreduce":', names) == ["allreduce"]
    assert naming('"allreduce"', 'if op == "allreduce":', names) == []
    assert naming('"none"', 'lr_scaling: str = "none"', names) == []
    assert naming('"--sync none ignores it"', "", names) == ["none"]
    assert naming('"ran local-sgd, 4 workers"', "", names) == ["local-sgd"]
    assert naming('"see sync/local_sgd.py"', "", names) == []
    assert naming('"fsdp"', "x = 'fsdp'", ["fsdp"]) == ["fsdp"]  # begins with a prefix letter
    assert naming('r"parameter-server"', "", ["parameter-server"]) == ["parameter-server"]


def _examples(line: str) -> bool:
    """The commands' EXAMPLES (a shared parser's RUN_EXAMPLES...), documentation their --help
    prints (checked below instead)."""
    return re.match(r"([A-Z]+_)?EXAMPLES = ", line) is not None


def test_no_strategy_is_named_outside_sync():
    names = sync.names()
    assert {"allreduce", "none", "fsdp", "sma"} <= set(names)
    spelled = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.is_relative_to(PACKAGE / "sync"):
            continue
        for number, text, line in _strings(path.read_text()):
            if not _examples(line):
                spelled += [f"{path.relative_to(PACKAGE)}:{number}: {name} in {text[:60]}"
                            for name in naming(text, line, names)]
    assert spelled == [], "ask parascale.sync (traits_of, DEFAULT, BASELINE, ...) instead"


def test_the_examples_of_the_commands_name_registered_strategies_and_options():
    seen = 0
    for path in sorted((PACKAGE / "cli").glob("*.py")):
        for _, text, line in _strings(path.read_text()):
            if _examples(line):
                for name in re.findall(r"--sync[ =]([\w.:-]+)", text):
                    assert name in sync.names(), f"{path.name}: --sync {name}"
                    seen += 1
    assert seen  # the walk saw some
