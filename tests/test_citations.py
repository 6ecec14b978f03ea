"""What the repository cites, a reader can find: no shipped text (code, docs, benchmarks,
examples) sends them to REFERENCE.md, the project's private notes, which are not in it; the
sources are cited themselves (paper, title and year, or address)."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ["src", "docs", "benchmarks", "examples", "README.md"]
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".txt", ".toml"}


def _shipped() -> list[Path]:
    files = []
    for name in SHIPPED:
        path = ROOT / name
        files += [path] if path.is_file() else [p for p in path.rglob("*")
                                                if p.is_file() and p.suffix in SUFFIXES]
    return files


def test_nothing_shipped_cites_a_file_the_repository_does_not_have():
    assert not (ROOT / "REFERENCE.md").exists()  # else citing it would be fine
    citing = {str(p.relative_to(ROOT)) for p in _shipped()
              if "REFERENCE.md" in p.read_text(errors="replace")}
    assert citing == set(), sorted(citing)


def test_the_25gbe_preset_cites_horovods_paper_itself():
    from parascale.predict.interconnect import preset

    source = preset("25gbe").source
    assert "Sergeev and Del Balso" in source and "arXiv:1802.05799" in source, source
