"""Study planner: DLBS-style fixed parameters (-P), variables (-V) and extensions.

A study is the Cartesian product of its variables over fixed parameters; values may refer to each
other or be computed, and extensions adjust, fork or skip configurations. Everything is resolved
here, before any run starts, so a typo or a reference cycle is reported at once rather than hours
into a study.

Value syntax (only strings are interpreted; other JSON values are taken as they are, and strings
inside lists and dicts are interpreted too):

- ``"${name}"``: exactly one reference takes the value of parameter ``name`` with its type
- ``"run_${name}.log"``: references inside longer text are substituted as text
  (``true``/``false``/``null`` for booleans and None, JSON for lists)
- ``"$( expr )$"`` or ``"= expr"``: computed with :mod:`parascale.bench.expr`, where
  ``${name}`` and bare ``name`` both refer to parameters
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parascale.batch import indivisible
from parascale.bench import expr, safeyaml
from parascale.bench.expr import REF_RE, ExprError, to_text
from parascale.errors import UsageError
from parascale import safejson
from parascale.safejson import Refused, check_shape

__all__ = [
    "PlanError", "PlannedRun", "build_plan", "parse_workers", "scaling_configs",
    "parse_assignment", "parse_variable", "parse_value", "load_study_file", "format_plan_table",
]

STUDY_KEYS = ("parameters", "variables", "extensions")
EXTENSION_KEYS = ("condition", "parameters", "cases", "skip")
MAX_REFERENCE_DEPTH = 100
MAX_RUNS = 100_000  # configurations in one plan (a 10,000-configuration --dry-run takes seconds)
_NAME_RE = re.compile(r"(?!__)[A-Za-z_][A-Za-z0-9_]*\Z")
_COMPUTED_RE = re.compile(r"\s*\$\((.*)\)\$\s*\Z", re.S)
_WHOLE_REF_RE = re.compile(REF_RE.pattern + r"\Z")
_INT_RE = re.compile(r"[+-]?\d+\Z")
_FLOAT_RE = re.compile(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?\Z")


class PlanError(UsageError):
    """A study cannot be planned: bad syntax, unknown name, reference cycle, bad extension."""


@dataclass(frozen=True)
class PlannedRun:
    """One configuration of a study; ``config_id`` names its results directory across resumes."""

    config_id: str
    params: dict[str, Any]
    skip_reason: str | None = None


def _check_name(name: object, what: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise PlanError(f"bad {what} name {name!r}: use letters, digits and '_', not starting "
                        "with a digit or '__' (so that expressions can refer to it)")
    return name


def _expression_of(value: str) -> str | None:
    match = _COMPUTED_RE.match(value)
    if match:
        return match.group(1)
    return value[1:] if value.startswith("=") else None


class _Resolver:
    """Resolves one configuration's raw values lazily, following references depth-first.

    ``chain`` is the path of names being resolved, which is what detects cycles and what the
    error messages show.
    """

    def __init__(self, raw: Mapping[str, Any]):
        self.raw = raw
        self.done: dict[str, Any] = {}

    def all(self) -> dict[str, Any]:
        return {name: self.get(name, ()) for name in self.raw}

    def get(self, name: str, chain: tuple[str, ...]) -> Any:
        if name in self.done:
            return self.done[name]
        if name in chain:
            cycle = " -> ".join(chain[chain.index(name):] + (name,))
            raise PlanError(f"reference cycle: {cycle}")
        if len(chain) > MAX_REFERENCE_DEPTH:  # resolution recurses; fail clearly, not by stack
            raise PlanError(f"references nested more than {MAX_REFERENCE_DEPTH} deep: "
                            f"{' -> '.join(chain[:5])} -> ...")
        if name not in self.raw:
            via = " -> ".join(chain + (name,))
            raise PlanError(f"{_who(chain)} refers to unknown name {name!r} ({via}); known "
                            f"names: {', '.join(sorted(self.raw)) or '(none)'}")
        self.done[name] = self.value(self.raw[name], chain + (name,))
        return self.done[name]

    def value(self, value: Any, chain: tuple[str, ...]) -> Any:
        if isinstance(value, str):
            return self._string(value, chain)
        if isinstance(value, (list, tuple)):
            return [self.value(item, chain) for item in value]
        if isinstance(value, dict):
            return {str(k): self.value(v, chain) for k, v in value.items()}
        if value is None or isinstance(value, (bool, int, float)):
            return value
        raise PlanError(f"{_who(chain)} has a value of type {type(value).__name__} ({value!r}); "
                        "use numbers, strings, booleans, null, lists or mappings")

    def _string(self, text: str, chain: tuple[str, ...]) -> Any:
        expression = _expression_of(text)
        if expression is not None:
            return self.compute(expression, chain)
        whole = _WHOLE_REF_RE.match(text)
        if whole:
            return self.get(whole.group(1), chain)
        if "${" in REF_RE.sub("", text):
            raise PlanError(f"{_who(chain)}: malformed reference in {text!r}; write ${{name}}")
        if "$(" in text:
            raise PlanError(f"{_who(chain)}: a computed value $( ... )$ must be the whole "
                            f"string, got {text!r}; use = format(...) to build text")
        return REF_RE.sub(lambda m: to_text(self.get(m.group(1), chain)), text)

    def compute(self, expression: str, chain: tuple[str, ...]) -> Any:
        try:
            env = {name: self.get(name, chain) for name in sorted(expr.names(expression))}
            result = expr.evaluate(expression, env)
        except ExprError as exc:
            raise PlanError(f"{_who(chain)}: {exc}") from exc
        return json.loads(json.dumps(result))  # tuples become lists, as in a study file


def _who(chain: tuple[str, ...]) -> str:
    if not chain:
        return "the study"
    # extension parts are labelled with spaces, which no parameter name has
    return chain[-1] if " " in chain[-1] else f"parameter {chain[-1]!r}"


@dataclass
class _Draft:
    raw: dict[str, Any]
    labels: tuple[str, ...]  # names whose values make the config id readable
    skip: str | None = None


def _check_extension(number: int, ext: object) -> dict[str, Any]:
    where = f"extension {number}"
    if not isinstance(ext, Mapping):
        raise PlanError(f"{where} must be a mapping with keys {', '.join(EXTENSION_KEYS)}")
    unknown = sorted(set(ext) - set(EXTENSION_KEYS))
    if unknown:
        raise PlanError(f"{where} has unknown key(s) {', '.join(map(str, unknown))}; "
                        f"accepted: {', '.join(EXTENSION_KEYS)}")
    if not isinstance(ext.get("condition", True), (str, bool)):
        raise PlanError(f"{where}: condition must be an expression string or a boolean")
    if not isinstance(ext.get("parameters", {}), Mapping):
        raise PlanError(f"{where}: parameters must be a mapping of name to value")
    cases = ext.get("cases", [{}])
    if not isinstance(cases, list) or not cases or not all(isinstance(c, Mapping) for c in cases):
        raise PlanError(f"{where}: cases must be a non-empty list of mappings")
    for name in [*ext.get("parameters", {}), *(k for c in cases for k in c)]:
        _check_name(name, f"{where} parameter")
    if "skip" in ext and not isinstance(ext["skip"], str):
        raise PlanError(f"{where}: skip must be a reason string")
    return dict(ext)


def _apply(ext: Mapping[str, Any], number: int, draft: _Draft) -> list[_Draft]:
    where = f"extension {number}"
    condition = ext.get("condition", True)
    if isinstance(condition, str):
        text = _expression_of(condition) or condition
        condition = _Resolver(draft.raw).compute(text, (f"{where} condition",))
    if not condition:
        return [draft]
    merged = {**draft.raw, **ext.get("parameters", {})}
    forks = []
    for case in ext.get("cases", [{}]):
        raw = {**merged, **case}
        labels = draft.labels + tuple(k for k in case if k not in draft.labels)
        skip = draft.skip  # the first reason is kept: it is usually the root cause
        if skip is None and "skip" in ext:
            skip = to_text(_Resolver(raw).value(ext["skip"], (f"{where} skip",)))
        forks.append(_Draft(raw, labels, skip))
    return forks


def _canonical(params: Mapping[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, separators=(",", ":"))


def _slug(value: Any) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", to_text(value)).strip("_")[:24] or "empty"


def _config_id(labels: Sequence[str], params: Mapping[str, Any], digest: str) -> str:
    """Readable and filesystem-safe; the hash keeps it unique and stable across invocations."""
    parts = [f"{name}-{_slug(params[name])}" for name in labels if name in params]
    return f"{'__'.join(parts)[:100] or 'run'}__{digest}"


def _check_count(count: int, cause: str) -> None:
    """Refuse, before expanding it, a plan no machine could run (and the planner could not hold)."""
    if count > MAX_RUNS:
        raise PlanError(f"{cause} make a plan of {count:,} configurations (the limit is "
                        f"{MAX_RUNS:,}); split the study")


def build_plan(parameters: Mapping[str, Any], variables: Mapping[str, Sequence[Any]],
               extensions: Iterable[Mapping[str, Any]] = ()) -> list[PlannedRun]:
    """Expand, resolve and extend a study into its runs; raise PlanError on any problem."""
    for name in parameters:
        _check_name(name, "parameter")
    for name, values in variables.items():
        _check_name(name, "variable")
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
            raise PlanError(f"variable {name!r} must be a non-empty list of values, "
                            f"got {values!r}")
    checked = [_check_extension(i, ext) for i, ext in enumerate(extensions, 1)]
    names = list(variables)
    _check_count(math.prod(len(variables[n]) for n in names), "the variables")
    drafts = [_Draft({**parameters, **dict(zip(names, combo))}, tuple(names))
              for combo in itertools.product(*(variables[n] for n in names))]
    for number, ext in enumerate(checked, 1):
        _check_count(len(drafts) * len(ext.get("cases", [{}])), f"extension {number}'s cases")
        drafts = [fork for draft in drafts for fork in _apply(ext, number, draft)]

    runs: list[PlannedRun] = []
    seen: set[str] = set()
    ids: set[str] = set()
    for draft in drafts:
        params = _Resolver(draft.raw).all()
        key = _canonical(params)
        if key in seen:
            continue
        seen.add(key)
        digest = hashlib.sha1(key.encode()).hexdigest()
        config_id = _config_id(draft.labels, params, digest[:8])
        if config_id in ids:  # an 8-hex collision: vanishingly rare, but ids must be unique
            config_id = _config_id(draft.labels, params, digest)
        ids.add(config_id)
        runs.append(PlannedRun(config_id, params, draft.skip))
    return runs


def parse_workers(spec: str, max_workers: int) -> list[int]:
    """Worker counts from '1,2,4', '1-4', 'pow2', 'pow2:8' or 'all' (and lists of those numbers)."""
    forms = "accepted forms: '1,2,4', '1-4', '1,2,8-10', 'pow2', 'pow2:8', 'all'"
    if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
        raise PlanError(f"max_workers must be a positive integer, got {max_workers!r}")
    text = str(spec).strip().lower()

    def too_many(n: int) -> PlanError:
        return PlanError(f"workers {spec!r} asks for {n} workers but at most {max_workers} "
                         "are available")

    if text == "all":
        return [max_workers]
    if text == "pow2" or text.startswith("pow2:"):
        cap = text[5:].strip() if text != "pow2" else str(max_workers)
        if not cap.isdigit() or int(cap) < 1:
            raise PlanError(f"bad workers {spec!r}: pow2:N needs a positive N; {forms}")
        if int(cap) > max_workers:
            raise too_many(int(cap))
        return [2 ** k for k in range(int(cap).bit_length())]
    counts: list[int] = []
    for item in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", item)
        low, high = (int(match[1]), int(match[2] or match[1])) if match else (0, 0)
        if not match or low < 1 or high < low:
            raise PlanError(f"bad workers {spec!r} (at {item.strip()!r}); {forms}")
        if high > max_workers:
            raise too_many(high)
        counts += [n for n in range(low, high + 1) if n not in counts]
    return counts


def scaling_configs(mode: str, workers: Sequence[int], batch_size: int | None = None,
                    global_batch: int | None = None,
                    ) -> list[tuple[int, int | None, int | None, str | None]]:
    """(N, per-device batch, global batch, skip reason) for weak or strong scaling.

    Weak scaling fixes the per-device batch b (global N*b); strong scaling fixes the global
    batch B (per-device B/N). A B that N does not divide stays in the plan, skipped with the
    reason, so that the report says why a point is missing (DLBS users found silent gaps
    confusing).
    """
    wants = {"weak": ("batch_size", "the per-device batch"),
             "strong": ("global_batch", "the global batch")}
    if mode not in wants:
        raise PlanError(f"unknown scaling mode {mode!r}; use 'weak' or 'strong'")
    given = {"batch_size": batch_size, "global_batch": global_batch}
    need, meaning = wants[mode]
    other = "global_batch" if need == "batch_size" else "batch_size"
    if given[need] is None or given[other] is not None:
        raise PlanError(f"{mode} scaling fixes {meaning}: give {need}"
                        + (f", not {other}" if given[other] is not None else ""))
    value = given[need]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanError(f"{need} must be a positive integer, got {value!r}")
    if not workers or any(isinstance(n, bool) or not isinstance(n, int) or n < 1
                          for n in workers):
        raise PlanError(f"worker counts must be positive integers, got {list(workers)!r}")
    if mode == "weak":
        return [(n, value, n * value, None) for n in workers]
    reasons = [indivisible(value, n) for n in workers]
    return [(n, None if reason else value // n, value, reason)
            for n, reason in zip(workers, reasons)]


def _cut(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def parse_value(text: str) -> Any:
    """A command-line value: int, float, true/false, null, JSON string/list/mapping, else text."""
    s = text.strip()
    try:
        if _INT_RE.match(s):
            return int(s)
        if _FLOAT_RE.match(s):
            return float(s)
        if s.lower() in ("true", "false", "null"):
            return {"true": True, "false": False, "null": None}[s.lower()]
        if s[:1] in ('"', "[", "{"):  # DLBS habit: -P 'model="resnet50"'
            return safejson.loads(s, max_depth=safeyaml.MAX_DEPTH)  # as deep as a study file
    except ValueError as exc:  # safejson.Refused included
        raise PlanError(f"bad value {_cut(text)!r}: {exc}") from None
    return s


def parse_assignment(text: str) -> tuple[str, Any]:
    """``-P name=value`` into (name, parsed value)."""
    name, sep, value = text.partition("=")
    if not sep or not _NAME_RE.match(name.strip()):
        raise PlanError(f"bad parameter {text!r}: expected name=value, e.g. batch_size=32")
    try:
        return name.strip(), parse_value(value)
    except PlanError as exc:
        raise PlanError(f"bad parameter {_cut(text)!r}: {exc}; expected name=value") from None


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside brackets and quotes, so '$(max(1,2))$' stays one value."""
    items, depth, quote, start = [], 0, None, 0
    for i, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    return items + [text[start:]]


def parse_variable(text: str) -> tuple[str, list[Any]]:
    """``-V name=v1,v2,v3`` or ``-V name=[v1, v2]`` (JSON) into (name, values)."""
    expected = "expected name=v1,v2,... or name=[v1, v2, ...]"
    name, sep, rest = text.partition("=")
    if not sep or not _NAME_RE.match(name.strip()):
        raise PlanError(f"bad variable {text!r}: {expected}")
    rest = rest.strip()
    if rest.startswith("["):
        try:
            values = safejson.loads(rest, max_depth=safeyaml.MAX_DEPTH)
        except Refused as exc:  # not JSON, or too deep
            raise PlanError(f"bad variable {_cut(text)!r}: invalid JSON list ({exc}); "
                            f"{expected}") from None
    else:
        items = _split_top_level(rest)
        if any(not item.strip() for item in items):
            raise PlanError(f"bad variable {text!r}: empty value; {expected}")
        try:
            values = [parse_value(item) for item in items]
        except PlanError as exc:
            raise PlanError(f"bad variable {text!r}: {exc}; {expected}") from None
    if not isinstance(values, list) or not values:
        raise PlanError(f"bad variable {text!r}: needs at least one value; {expected}")
    return name.strip(), values


def _parse_file(path: Path, text: str, what: str) -> Any:
    if path.suffix.lower() == ".toml":
        try:
            import tomllib
        except ModuleNotFoundError:  # Python 3.10
            raise PlanError(f"reading {path.name} needs Python 3.11+ (tomllib); use YAML") from None
        try:
            data = tomllib.loads(text)  # refuses duplicate keys itself
        except tomllib.TOMLDecodeError as exc:
            raise PlanError(f"cannot parse {what} {str(path)!r}: {exc}") from None
        except RecursionError:
            raise PlanError(f"{what} {str(path)!r}: nested more than {safeyaml.MAX_DEPTH} "
                            "levels deep (the limit)") from None
    else:  # YAML, and so JSON
        import yaml

        try:
            data = safeyaml.load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or exc
            raise PlanError(f"cannot parse {what} {str(path)!r}{where}: {problem}") from None
        except Refused as exc:
            raise PlanError(f"{what} {str(path)!r}: {exc}") from None
    try:  # the planner walks values recursively: bound the nesting of TOML files too
        check_shape(data, max_depth=safeyaml.MAX_DEPTH)
    except Refused as exc:
        raise PlanError(f"{what} {str(path)!r}: {exc}") from None
    return data


def read_file(path: str | os.PathLike[str], what: str = "study file",
              suffixes: tuple[str, ...] = (".yaml", ".yml", ".toml")) -> Any:
    """A YAML or TOML file (``what`` names it in messages), size- and depth-bounded."""
    file = Path(path)
    if file.suffix.lower() not in suffixes:
        raise PlanError(f"{what} {str(file)!r} must end in {', '.join(suffixes[:-1])} or "
                        f"{suffixes[-1]}")
    if file.exists() and not file.is_file():  # a folder, or a FIFO that would block the read
        raise PlanError(f"{what} {str(file)!r} is not a regular file")
    try:
        with open(file, "rb") as handle:
            raw = handle.read(safeyaml.MAX_BYTES + 1)  # never more, whatever the file is
        if len(raw) > safeyaml.MAX_BYTES:
            raise PlanError(f"{what} {str(file)!r} is larger than {safeyaml.MAX_BYTES:,} "
                            "bytes (the limit)")
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise PlanError(f"{what} {str(file)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PlanError(f"cannot read {what} {str(file)!r}: {exc}") from None
    return _parse_file(file, text, what)


def load_study_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a YAML or TOML study file into {"parameters", "variables", "extensions"}."""
    file = Path(path)
    data = read_file(file)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise PlanError(f"study file {str(file)!r} must be a mapping with keys "
                        f"{', '.join(STUDY_KEYS)}")
    unknown = sorted(map(str, set(data) - set(STUDY_KEYS)))
    if unknown:
        raise PlanError(f"study file {str(file)!r} has unknown key(s) {', '.join(unknown)}; "
                        f"accepted: {', '.join(STUDY_KEYS)}")
    study = {"parameters": data.get("parameters") or {}, "variables": data.get("variables") or {},
             "extensions": data.get("extensions") or []}
    for key, kind in (("parameters", dict), ("variables", dict), ("extensions", list)):
        if not isinstance(study[key], kind):
            raise PlanError(f"study file {str(file)!r}: {key} must be a "
                            f"{'mapping' if kind is dict else 'list'}")
    return study


def format_plan_table(runs: Sequence[PlannedRun]) -> str:
    """A plain-text table for --dry-run: config id, the parameters that vary, and the status."""
    if not runs:
        return "(empty plan: no runs)"
    names: list[str] = []
    for run in runs:
        names += [name for name in run.params if name not in names]
    varying = [name for name in names
               if len({json.dumps(run.params.get(name, "\0missing")) for run in runs}) > 1]

    def cell(run: PlannedRun, name: str) -> str:
        text = to_text(run.params[name]) if name in run.params else "-"
        return text if len(text) <= 40 else text[:37] + "..."

    rows = [["config", *varying, "status"]]
    rows += [[run.config_id, *(cell(run, n) for n in varying),
              "planned" if run.skip_reason is None else f"skipped: {run.skip_reason}"]
             for run in runs]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    skipped = sum(run.skip_reason is not None for run in runs)
    lines.append(f"{len(runs)} runs: {len(runs) - skipped} planned, {skipped} skipped")
    return "\n".join(lines)
