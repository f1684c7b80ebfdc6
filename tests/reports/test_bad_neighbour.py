"""One bad neighbour does not spoil a report (issue 40, class 6): a sibling run whose results are
mostly not records (a corrupt or foreign file) is left out whole in one line naming it, read no
further than it takes to tell; a sibling with a few bad lines keeps its good records and is still
one line; neither swells the page."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from harness.planning.shards import durations_from
from harness.records.results import MOST_LINES_LEFT_OUT
from harness.reports.history import load_history
from tests.support.paths import REPO_ROOT
from tests.support.report_fixture import records, write_reports, write_run

GARBAGE_LINES = 200_000


def _report(current: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness", "report", str(current)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_a_sibling_full_of_garbage_is_one_line_and_leaves_the_page_as_it_was(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    current = write_reports(reports)
    clean = _report(current)
    assert clean.returncode in (0, 1), clean.stderr
    size_clean = (current / "index.html").stat().st_size

    bad = write_run(reports / "corrupt", "corrupt", "2026-11-18T10:00:00+00:00", records("corrupt"))
    with open(bad / "results.jsonl", "w") as fh:  # ~9 MB of lines that are JSON and no record
        fh.writelines(json.dumps({"garbage": i, "padding": "x" * 20}) + "\n" for i in range(GARBAGE_LINES))
    started = time.monotonic()
    done = _report(current)
    took = time.monotonic() - started
    assert done.returncode in (0, 1), done.stderr
    warned = [line for line in done.stderr.splitlines() if "corrupt" in line]
    assert len(warned) == 1 and "is not a run's results" in warned[0], done.stderr
    assert f"more than {MOST_LINES_LEFT_OUT} of its lines are not records" in warned[0]
    assert len(done.stderr.splitlines()) < 5
    page = (current / "index.html").read_text()
    assert page.count("corrupt/results.jsonl") == 1
    assert abs(len(page.encode()) - size_clean) < 8 * 1024, (len(page.encode()), size_clean)
    assert took < 60
    # The shards' balance reads the history the same way: one line for it.
    (balanced,) = [s for s in durations_from(reports).skipped if "corrupt" in s]
    assert "is not a run's results" in balanced


def test_a_sibling_with_a_few_bad_lines_keeps_its_records_in_one_line(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    current = write_reports(reports)
    good = records("few")
    bad = [*good[:2], {**good[2], "outcome": "GREAT"}, {**good[3], "wall_s": "slow"}, *good[4:]]
    write_run(reports / "few", "few", "2026-11-18T10:00:00+00:00", bad)
    skipped: list[str] = []
    runs = load_history(current, skipped=skipped)
    (said,) = skipped
    assert "few/results.jsonl: line 3: " in said and "(and 1 more of its lines, left out too)" in said
    (few,) = [r for r in runs if r.name == "few"]
    assert len(few.records) == len(good) - 2
