"""A report from studies: load them (the plan's runs, each run's time to a target), print the
terminal summary, and write every file (summary.csv, summary.md, the plots, report.html last)."""
from __future__ import annotations

from pathlib import Path

from parascale.errors import UsageError
from parascale.files import atomic_write_text
from parascale.report.accuracy import apply_target
from parascale.report.explain import noise_sentences
from parascale.report.inplan import keep_planned, outside_lines
from parascale.report.load import Loaded, load_records
from parascale.report.rows import summary_rows
from parascale.report.tables import escaped, format_csv, format_markdown, format_terminal, wrap
from parascale.report.wording import busy_sentence, sentences


def default_out_dir(study: Path) -> Path:
    """STUDY/report; for a record file, the report folder next to it."""
    study = Path(study)
    return (study.parent if study.is_file() else study) / "report"


def write_report(study_paths: list[Path], out_dir: Path | None = None) -> Path:
    """Load the studies and write the whole report into ``out_dir`` (default: first STUDY/report).

    Raises UsageError, before writing anything, when a path does not exist or holds no record.
    """
    if not study_paths:
        raise UsageError("report: give at least one STUDY folder or record.json file")
    loaded = load_studies(study_paths)
    return write_loaded(loaded, Path(out_dir) if out_dir else default_out_dir(study_paths[0]))


def load_studies(paths: list[Path] | list[str],
                 target: float | tuple[str, float] | None = None) -> Loaded:
    """:func:`load_records`, then each study folder's runs outside its plan set apart, and every
    run's time to ``target`` (or to the target it was trained with) read from its curve."""
    loaded = keep_planned(load_records(paths))
    apply_target(loaded, target)
    return loaded


def terminal_summary(loaded: Loaded) -> str:
    """What bench and report print: the tables (with runs on a busy machine, unfinished runs and
    runs not in the plan), then one sentence per series on how it scaled, 120 columns wide."""
    rows = summary_rows(loaded.records)
    text = format_terminal(rows, loaded.unfinished, loaded.problems, outside_lines(loaded))
    warning = busy_sentence(rows)  # already at the head of the busy-machine block
    said = [s for s in sentences(rows, loaded.unfinished) if s != warning] + \
        noise_sentences(loaded.records)
    if not said:
        return text
    return text + "\n\n" + "\n".join(line for s in said for line in wrap(escaped(s)))


def write_loaded(loaded: Loaded, out_dir: Path) -> Path:
    """Write every output for already loaded records; report.html last, so it implies the rest."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"report: --out {out_dir} exists and is not a folder")
    # matplotlib (a second) only to write: reading records and refusing bad ones stay quick
    from parascale.report.html import render_html
    from parascale.report.plots import make_plots, write_plots

    rows = summary_rows(loaded.records)
    unfinished, problems = loaded.unfinished, loaded.problems
    plots = make_plots(rows)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out_dir / "summary.csv", format_csv(rows, unfinished, problems))
        atomic_write_text(out_dir / "summary.md", format_markdown(rows, unfinished, problems,
                                                                   outside_lines(loaded)))
        write_plots(plots, out_dir)
        files = ["summary.csv", "summary.md"] + [f"{p.name}.{ext}" for p in plots for ext in ("png", "svg")]
        return atomic_write_text(out_dir / "report.html",
                                 render_html(loaded, rows, plots, files, out_dir))
    except OSError as exc:
        raise UsageError(f"report: cannot write to {out_dir}: {exc.strerror or exc}") from exc
