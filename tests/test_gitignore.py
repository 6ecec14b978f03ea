"""Every folder the README's and docs' example commands write into (--out, --tensorboard,
--data-dir) is in .gitignore, so that trying the examples in a clone leaves git status clean."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WRITES = re.compile(r"--(?:out|tensorboard|data-dir)[ =]+([a-z][\w.-]*)/?", re.ASCII)
# commands, not prose ("without --out a script..."): fenced blocks and `inline code`
CODE = re.compile(r"^```.*?^```|`[^`\n]+`", re.MULTILINE | re.DOTALL)


def _ignored_top_folders() -> set[str]:
    lines = (ROOT / ".gitignore").read_text().splitlines()
    return {line.strip().strip("/") for line in lines
            if line.strip().startswith("/") and line.strip().endswith("/")}


def test_every_folder_the_examples_write_is_ignored():
    written = {}
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        code = "\n".join(block.group(0) for block in CODE.finditer(doc.read_text()))
        for match in WRITES.finditer(code):
            top = match.group(1).split("/")[0]
            written.setdefault(top, doc.name)
    assert {"runs", "studies", "hpo", "tb"} <= set(written), written  # the examples seen
    missing = {top: doc for top, doc in written.items() if top not in _ignored_top_folders()}
    assert not missing, f"not in .gitignore (folder: the doc whose example writes it): {missing}"
