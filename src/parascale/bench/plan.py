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

Values from the command line are parsed in :mod:`.values`, study files read in
:mod:`.studyfile`, and the --dry-run table aligned by :func:`parascale.columns.aligned`.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from parascale.batch import indivisible
from parascale.bench import expr
from parascale.bench.expr import REF_RE, ExprError, to_text
from parascale.bench.values import NAME_RE, PlanError
from parascale.columns import aligned
from parascale.digits import is_count

__all__ = ["PlanError", "PlannedRun", "build_plan", "parse_workers", "scaling_configs",
           "format_plan_table"]

EXTENSION_KEYS = ("condition", "parameters", "cases", "skip")
MAX_REFERENCE_DEPTH = 100
MAX_RUNS = 100_000  # configurations in one plan (a 10,000-configuration --dry-run takes seconds)
_COMPUTED_RE = re.compile(r"\s*\$\((.*)\)\$\s*\Z", re.S)
_WHOLE_REF_RE = re.compile(REF_RE.pattern + r"\Z")


@dataclass(frozen=True)
class PlannedRun:
    """One configuration of a study; ``config_id`` names its results directory across resumes."""

    config_id: str
    params: dict[str, Any]
    skip_reason: str | None = None


def _check_name(name: object, what: str) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
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
        if not is_count(cap) or int(cap) < 1:
            raise PlanError(f"bad workers {spec!r}: pow2:N needs a positive N; {forms}")
        if int(cap) > max_workers:
            raise too_many(int(cap))
        return [2 ** k for k in range(int(cap).bit_length())]
    counts: list[int] = []
    for item in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", item, re.ASCII)
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
    rows.insert(1, ["-" * max(len(row[i]) for row in rows) for i in range(len(rows[0]))])
    skipped = sum(run.skip_reason is not None for run in runs)
    return aligned(rows) + f"\n{len(runs)} runs: {len(runs) - skipped} planned, {skipped} skipped"
