"""The HTML report in a real headless Chromium (Debian's ``chromium``): the matrix
table's content as the browser built it, no script error, nothing injected ran, and
a screenshot kept in ``reports/test-artifacts/report.png``."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import pytest

from harness.records.run_dir import RunDir
from harness.reports import html as html_report
from harness.reports.finished import FinishedRun
from tests.support.paths import REPO_ROOT
from tests.support.report_fixture import records, write_reports, write_run


def write_report(run_dir: Path) -> Path:
    return html_report.write(FinishedRun.load(RunDir(run_dir)))


CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = REPO_ROOT / "reports" / "test-artifacts"
#: A message that would mark the page if it ever ran as markup.
INJECTED = (
    "<script>document.body.setAttribute('data-injected', 'script')</script>"
    "<img src=x onerror=\"document.body.setAttribute('data-injected', 'img')\"> \"quoted\""
)

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM} (apt-get install chromium; .ci/run installs it)"
)


class Page(HTMLParser):
    """The dumped DOM: the body's attributes and the text of the matrix table, row by row."""

    def __init__(self) -> None:
        super().__init__()
        self.body: dict[str, str | None] = {}
        self.rows: list[list[str]] = []
        self.open_details: list[str] = []
        self._in_matrix = False
        self._in_summary = 0
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if tag == "body":
            self.body = attributes
        elif tag == "table" and attributes.get("id") == "matrix":
            self._in_matrix = True
        elif self._in_matrix and tag == "tr":
            self.rows.append([])
        elif self._in_matrix and tag in ("td", "th"):
            self._cell = []
        elif tag == "details" and "open" in attributes:
            self.open_details.append(attributes.get("id") or "")
        elif self._in_matrix and tag == "div" and "details" in (attributes.get("class") or ""):
            self._in_summary += 1  # inside an entry's details: not the table's own text

    def handle_endtag(self, tag: str) -> None:
        if tag == "table" and self._in_matrix:
            self._in_matrix = False
        elif self._in_matrix and tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append(" ".join("".join(self._cell).split()))
            self._cell = None
            self._in_summary = 0

    def handle_data(self, data: str) -> None:
        if self._cell is not None and not self._in_summary:
            self._cell.append(data)


def chromium(url: str, screenshot: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Chromium's DOM of ``url`` after its scripts ran (and a screenshot of its top)."""
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        return subprocess.run(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                # Offline: any name the page tried to look up would fail.
                "--host-resolver-rules=MAP * ~NOTFOUND",
                "--enable-logging=stderr",
                f"--user-data-dir={profile}",
                "--window-size=1400,2400",
                *([f"--screenshot={screenshot}"] if screenshot else []),
                "--dump-dom",
                url,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )


def test_report_renders_in_chromium_without_script_errors(tmp_path: Path) -> None:
    run_dir = write_reports(tmp_path / "reports")
    recs = records("run-b", slower=0.02)
    for rec in recs:
        if rec["outcome"] == "DIFFERENT_ERROR":
            rec["error"]["message"] = INJECTED
            rec["ranks"][1]["log_tail"] += "\n" + INJECTED
    write_run(run_dir, "run-b", "2026-11-20T10:00:00+00:00", recs)
    page = write_report(run_dir)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    screenshot = ARTIFACTS / "report.png"
    screenshot.unlink(missing_ok=True)

    done = chromium(page.as_uri(), screenshot)

    assert done.returncode == 0, done.stderr[-3000:]
    dom = Page()
    dom.feed(done.stdout)
    # The page's own script ran to its end, and nothing raised or was blocked on the way.
    assert dom.body.get("data-report-ready") == "12", done.stdout[:2000]
    assert "data-script-error" not in dom.body, dom.body["data-script-error"]
    assert "data-injected" not in dom.body
    assert dom.open_details == []
    console_errors = [
        line
        for line in done.stderr.splitlines()
        if "CONSOLE" in line and any(word in line for word in ("Uncaught", "Refused", "violates"))
    ]
    assert not console_errors, console_errors
    # The matrix as the browser built it: cells across, repro x mode down.
    header, *rows = dom.rows
    assert header == ["repro / mode", "current", "ds-0.19.2", "tf4"]
    table = {row[0]: row[1:] for row in rows}
    assert list(table) == ["F1 / bug", "F1 / fixed", "F2 / bug", "F2 / fixed"]
    assert table["F1 / bug"][0].startswith("NOT_REPRODUCED ✓")
    assert table["F1 / bug"][1].startswith("REPRODUCED ✓")
    assert table["F1 / bug"][2].startswith("UNRESOLVABLE ✗ no environment")
    assert table["F1 / fixed"][1].startswith("PASS ✓") and "guards: ds-zero3-ckpt-reentrant" in table["F1 / fixed"][1]
    assert table["F1 / fixed"][2] == "excluded"  # its reason: folded below the table
    assert "needs transformers 5 (&lt;i&gt;see&lt;/i&gt; #12)" in done.stdout.split('id="excluded-items"', 1)[1]
    assert table["F2 / bug"][1].startswith("DIFFERENT_ERROR ✗ expected REPRODUCED")
    assert table["F2 / fixed"][0].startswith("FAIL ✗ expected PASS")
    # The injected message reached the page as text, never as markup.
    assert "&lt;script&gt;document.body.setAttribute" in done.stdout
    assert screenshot.exists() and screenshot.stat().st_size > 10_000
    # A link to an entry opens its details (the page's script does): here the injected message's.
    linked = chromium(page.as_uri() + "#item-6")
    assert linked.returncode == 0, linked.stderr[-3000:]
    opened = Page()
    opened.feed(linked.stdout)
    assert opened.open_details == ["item-6"] and "data-script-error" not in opened.body
