"""Reading a study file (YAML or TOML; hpo's search spaces too): bounded in size and depth,
duplicate keys refused, YAML aliases expanded within a limit (:mod:`.safeyaml`), and a file that
is not a regular file never read."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from parascale.bench import safeyaml
from parascale.bench.values import PlanError
from parascale.safejson import Refused, check_shape

STUDY_KEYS = ("parameters", "variables", "extensions")
#: a study of a script may name it, and its arguments, at the top: parameters like any other
SCRIPT_KEYS = ("script", "script_args")


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
    unknown = sorted(map(str, set(data) - set(STUDY_KEYS) - set(SCRIPT_KEYS)))
    if unknown:
        raise PlanError(f"study file {str(file)!r} has unknown key(s) {', '.join(unknown)}; "
                        f"accepted: {', '.join(STUDY_KEYS + SCRIPT_KEYS)}")
    study = {"parameters": data.get("parameters") or {}, "variables": data.get("variables") or {},
             "extensions": data.get("extensions") or []}
    for key, kind in (("parameters", dict), ("variables", dict), ("extensions", list)):
        if not isinstance(study[key], kind):
            raise PlanError(f"study file {str(file)!r}: {key} must be a "
                            f"{'mapping' if kind is dict else 'list'}")
    for key in SCRIPT_KEYS:
        if key in data:
            if key in study["parameters"] or key in study["variables"]:
                raise PlanError(f"study file {str(file)!r} gives {key} twice: at the top and "
                                "under parameters or variables; give it once")
            study["parameters"] = {**dict(study["parameters"]), key: data[key]}
    return study
