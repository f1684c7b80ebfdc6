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

from tests.paths import REPO_ROOT
from tests.unit.report_fixture import HOSTILE, write_reports

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
        "version: 1\ndefault_lane: ci\nlanes: {ci: \"the orchestrator's own interpreter, which has no torch\"}\n"
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
