"""What a CI log gets: the rich table as plain text, never a colour code, and a run
that writes its results, JUnit XML and HTML report even when nothing could run."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from junitparser import JUnitXml

from tests.support.paths import REPO_ROOT
from tests.support.report_fixture import HOSTILE, write_reports

ESC = "\x1b"


def piped(*args: str, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    """``python -m harness ARGS`` with its output going to a pipe, as in a CI log."""
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")}
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_report_command_prints_a_plain_table_and_writes_the_html(tmp_path: Path) -> None:
    run_dir = write_reports(tmp_path / "reports")
    done = piped("report", str(run_dir))
    assert done.returncode == 1, done.stderr  # three items did not match
    assert ESC not in done.stdout + done.stderr
    assert "repro / mode" in done.stdout and "DIFFERENT_ERROR ✗ expected REPRODUCED" in done.stdout
    assert "excluded" in done.stdout  # the excluded item from run.json is in the table
    # A message is printed as it is: rich markup in it is not interpreted.
    assert HOSTILE in done.stdout
    assert f"report: {run_dir / 'index.html'}" in done.stdout
    assert (run_dir / "index.html").stat().st_size > 10_000


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="this interpreter has torch: F1 would run")
def test_a_piped_run_writes_results_junit_and_html_without_colour_codes(tmp_path: Path) -> None:
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(
        'version: 1\ndefault_lane: ci\nlanes: {ci: "the orchestrator\'s own interpreter, which has no torch"}\n'
        "cells:\n  here: {passthrough: true, lanes: [ci]}\n"
    )
    out = tmp_path / "reports" / "run"
    done = piped("run", "--matrix", str(matrix), "--repros", "F1", "--out", str(out))
    assert done.returncode == 1, done.stdout + done.stderr
    assert ESC not in done.stdout + done.stderr
    assert "UNRESOLVABLE ✗ no environment" in done.stdout and f"report: {out / 'index.html'}" in done.stdout
    assert (out / "results.jsonl").read_text().count("\n") == 2
    assert JUnitXml.fromfile(str(out / "junit.xml")).failures == 2
    page = (out / "index.html").read_text()
    assert "has no torch installed" in page and 'id="matrix"' in page


def test_escape_codes_from_a_run_never_reach_the_terminal_and_merge_can_be_retried(tmp_path: Path) -> None:
    from tests.support.report_fixture import records, write_run

    hostile = records("run-c")
    for rec in hostile:
        if rec.get("error"):
            rec["error"]["message"] = "\x1b[2J\x1b[31mcleared\x1b[0m \x00 and a NUL"
            rec["reasons"] = ["\x1b]0;hijacked title\x07"]
    shard = write_run(tmp_path / "shard", "run-c", "2026-11-20T10:00:00+00:00", hostile)
    done = piped("report", str(shard))
    assert ESC not in done.stdout + done.stderr and "\\x1b[2J" in done.stdout
    assert JUnitXml.fromfile(str(shard / "junit.xml")) is not None
    merged = tmp_path / "merged"
    first = piped("merge", str(merged), str(shard))
    assert first.returncode == 0, first.stderr and ESC not in first.stdout
    assert (merged / "junit.xml").is_file() and (merged / "index.html").is_file()
    # A merge into a directory that already holds a run is refused, and nothing of it is touched.
    again = piped("merge", str(merged), str(shard))
    assert again.returncode == 2 and "choose a new OUT directory" in again.stderr


def test_progress_line_tells_a_missed_expectation_from_an_item_that_has_none() -> None:
    from harness.records.item import ItemRecord
    from harness.reports.progress import progress_line

    base = {
        "schema_version": 1,
        "run_id": "run",
        "cell": "c",
        "repro": "F1",
        "signature": None,
        "versions": {},
        "world_size": 2,
        "device": "cpu",
        "wall_s": 1.0,
        "error": None,
        "reasons": [],
        "guards": [],
        "env": None,
        "repro_cmd": "",
        "started_at": "2026-11-20T10:00:00+00:00",
        "finished_at": "2026-11-20T10:00:01+00:00",
    }

    def record(**fields: object) -> ItemRecord:
        return ItemRecord.model_validate({**base, **fields})

    assert progress_line(
        record(mode="as-documented", outcome="REPRODUCED", expected="REPRODUCED", matched=True)
    ).startswith("✓ c/F1/as-documented: REPRODUCED (expected REPRODUCED)")
    assert progress_line(record(mode="as-documented", outcome="PASS", expected="REPRODUCED", matched=False)).startswith(
        "✗ c/F1/as-documented: PASS (expected REPRODUCED)"
    )
    variant = progress_line(record(mode="zero2", outcome="PASS", expected=None, matched=False))
    assert variant.startswith("· c/F1/zero2: PASS (no expectation)") and "None" not in variant
