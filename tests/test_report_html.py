"""The report page: escaping, embedded images, and a real load in headless Chromium."""
from __future__ import annotations

import base64
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from parascale.report import write_report
from conftest import machine_block, record, run_chromium, write_study
from helpers import repeats, with_ids

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
EVIL = "<script>alert('x')</script>"

# Injected into a test copy only (the report itself runs no script): records uncaught errors,
# failed resource loads and console.error calls, then checks that every image decoded.
PROBE = """<script>
window.__errors = [];
window.addEventListener('error', function (e) {
  window.__errors.push(e.message || ('failed to load ' + (e.target && e.target.tagName)));
}, true);
var __consoleError = console.error;
console.error = function () {
  window.__errors.push([].join.call(arguments, ' '));
  __consoleError.apply(console, arguments);
};
window.addEventListener('load', function () {
  var images = Array.prototype.slice.call(document.images);
  var out = document.createElement('pre');
  out.id = 'probe';
  out.textContent = JSON.stringify({
    images: images.length,
    undecoded: images.filter(function (i) { return !(i.complete && i.naturalWidth > 0); }).length,
    errors: window.__errors});
  document.body.appendChild(out);
});
</script>"""


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    """A two-model study with a hostile model name, a failure with a hostile reason, and junk."""
    folder = tmp_path_factory.mktemp("html")
    recs = [record(n, 1000.0 * n * e, model=EVIL) for n, e in ((1, 1.0), (2, 0.9), (4, 0.8))]
    recs += [record(n, 100.0 * n * e, model="resnet152") for n, e in ((1, 1.0), (2, 0.95))]
    recs += [record(8, model="resnet152", status="failed", reason="rank 1: <img src=x onerror=alert(1)>")]
    study = write_study(folder / "study", recs)
    (study / "runs" / "junk").mkdir()
    (study / "runs" / "junk" / "record.json").write_text("not json & <b>bold</b>")
    return write_report([study])


def test_user_text_is_escaped(report):
    page = report.read_text()
    assert EVIL not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "<script" not in page  # the report runs no script at all


def test_page_says_what_was_run_and_what_failed(report):
    page = report.read_text()
    for text in ("What was run", "Environment", "Test CPU", "Results", "Plots",
                 "E = t1/tN (t = time per step, per-device batch fixed)",
                 "resnet152 on digits, weak scaling: 2 workers reach 1.90× the throughput of 1 "
                 "(efficiency 95%). Not finished: N=8 (failed).",
                 "Not finished or unreadable", "unreadable: JSONDecodeError"):
        assert text in page, text


def test_images_are_embedded_png_data_uris(report):
    page = report.read_text()
    images = re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) == 8  # seven scaling plots (memory too) and the comparison of the models
    for data in images:
        assert base64.b64decode(data)[:8] == PNG_MAGIC
    for name in ("summary.csv", "summary.md", "throughput.png", "comparison.svg"):
        assert (report.parent / name).stat().st_size > 0


# ---- headless Chromium ------------------------------------------------------------------------

def _probe(page: Path, tmp_path: Path) -> tuple[dict, list[str]]:
    """Load a probed copy of ``page``; return the probe's findings and Chromium's console lines."""
    html = page.read_text()
    probed = tmp_path / "probed.html"
    probed.write_text(html.replace('<meta charset="utf-8">', '<meta charset="utf-8">' + PROBE, 1))
    result = run_chromium(tmp_path / "profile-probe", "--dump-dom", probed.as_uri())
    found = re.search(r'<pre id="probe">(.*?)</pre>', result.stdout, re.S)
    assert found, f"page never finished loading: {result.stderr[-2000:]}"
    findings = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    console = [line for line in result.stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]
    return findings, console


@pytest.mark.slow
def test_page_loads_in_chromium_without_errors_and_renders(report, tmp_path):
    findings, console = _probe(report, tmp_path)
    assert findings == {"images": 8, "undecoded": 0, "errors": []}
    assert console == []
    shot = tmp_path / "screenshot.png"
    result = run_chromium(tmp_path / "profile-shot", f"--screenshot={shot}", "--window-size=1200,3000",
                           "--hide-scrollbars", report.as_uri())
    assert shot.exists(), result.stderr[-2000:]
    assert shot.read_bytes()[:8] == PNG_MAGIC and shot.stat().st_size > 20_000
    if os.environ.get("PARASCALE_KEEP_SCREENSHOT"):  # for a person to look at
        shutil.copy(shot, os.environ["PARASCALE_KEEP_SCREENSHOT"])


@pytest.mark.slow
def test_chromium_probe_catches_broken_images_and_script_errors(tmp_path):
    """The check above is only worth something if it fails on a broken page."""
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><head><meta charset="utf-8"></head><body>'
                   '<img src="data:image/png;base64,AAAA"><script>undefinedFunction();</script>'
                   "</body></html>")
    findings, console = _probe(bad, tmp_path)
    assert findings["images"] == 1 and findings["undecoded"] == 1
    assert any("undefinedFunction" in e for e in findings["errors"])
    assert any("Uncaught" in line for line in console)


# Injected into a test copy only: after layout, how many table containers are wider than the
# page lets them be (cut off, or scrolled sideways).
OVERFLOW_PROBE = """<script>
window.addEventListener('load', function () {
  var boxes = Array.prototype.slice.call(document.querySelectorAll('.wide'));
  var out = document.createElement('pre');
  out.id = 'overflow';
  out.textContent = JSON.stringify({tables: boxes.length, overflowing: boxes.filter(
    function (b) { return b.scrollWidth > b.clientWidth + 1; }).map(
    function (b) { return b.scrollWidth + '>' + b.clientWidth; })});
  document.body.appendChild(out);
});
</script>"""


@pytest.mark.slow
def test_report_tables_fit_the_page_in_chromium(tmp_path):
    import re


    tta = {"target": 0.9, "reached": True, "epoch": 3, "elapsed_s": 14.2}
    records = []
    for scaling in ("weak", "strong"):
        for n, xs in ((1, [1010.0, 1000.0, 990.0]), (2, [1500.0, 1440.0, 1380.0]),
                      (4, [2600.0, 2500.0, 2300.0])):
            extra = {"scaling": scaling, "tta": tta, "global_batch": 128 if scaling == "strong"
                     else None}
            records += repeats(n, xs, machine=machine_block() if n == 4 else None, **extra)
            if n > 1:
                records += repeats(n, [x * 1.1 for x in xs], baseline=True, sync="none", **extra)
    for rec in records:
        rec["study"]["config_id"] += f"-{rec['study']['scaling']}"
    page = write_report([write_study(tmp_path / "study", with_ids(records))])
    probed = tmp_path / "probed.html"
    probed.write_text(page.read_text().replace('<meta charset="utf-8">',
                                               '<meta charset="utf-8">' + OVERFLOW_PROBE, 1))
    result = run_chromium(tmp_path / "profile", "--window-size=1200,3000", "--dump-dom",
                           probed.as_uri())
    found = re.search(r'<pre id="overflow">(.*?)</pre>', result.stdout, re.S)
    assert found, result.stderr[-2000:]
    seen = json.loads(found.group(1).replace("&quot;", '"'))
    assert seen["tables"] >= 3 and seen["overflowing"] == [], seen
