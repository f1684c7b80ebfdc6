"""What compare, merge and report do with run directories that are not what they should be:
one line naming the file, the field and the fix, exit 2; never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO_ROOT
from tests.support.report_fixture import records, write_run

GOOD_LINE = {
    "schema_version": 1,
    "run_id": "r",
    "cell": "c",
    "repro": "F1",
    "mode": "bug",
    "outcome": "REPRODUCED",
    "matched": True,
    "expected": "REPRODUCED",
    "signature": None,
    "versions": {},
    "world_size": 2,
    "device": None,
    "wall_s": 0.0,
    "error": None,
    "reasons": [],
    "guards": [],
    "env": None,
    "repro_cmd": "python -m harness run",
    "started_at": "t0",
    "finished_at": "t1",
}


def harness(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )


def good_run(path: Path) -> Path:
    started = "2026-11-20T10:00:00+00:00"
    # Every record a run writes says when its item started and finished.
    whole = [{"started_at": started, "finished_at": started, **r} for r in records("run-ok")]
    return write_run(path, "run-ok", started, whole)


DAMAGE = {
    "binary results": lambda d: (d / "results.jsonl").write_bytes(b"\x00\xff\xfe\x80 binary\n" + b"{}\n"),
    "a line that is a list": lambda d: (d / "results.jsonl").write_text("[1, 2, 3]\n" + json.dumps(GOOD_LINE) + "\n"),
    "a line that is a number": lambda d: (d / "results.jsonl").write_text("42\n" + json.dumps(GOOD_LINE) + "\n"),
    "an unknown schema version": lambda d: (d / "results.jsonl").write_text(
        json.dumps({**GOOD_LINE, "schema_version": 7}) + "\n"
    ),
    "run.json a list": lambda d: (d / "run.json").write_text("[]"),
    "run.json not JSON": lambda d: (d / "run.json").write_text("{oops"),
    "results a directory": lambda d: ((d / "results.jsonl").unlink(), (d / "results.jsonl").mkdir()),
}


@pytest.mark.parametrize("damage", list(DAMAGE), ids=list(DAMAGE))
@pytest.mark.parametrize("verb", ["compare", "merge", "report"])
def test_a_damaged_run_directory_is_one_line_and_exit_2(tmp_path: Path, damage: str, verb: str) -> None:
    if verb == "compare" and damage.startswith("run.json"):
        pytest.skip("compare reads only the results")
    ok = good_run(tmp_path / "ok")
    bad = good_run(tmp_path / "bad")
    DAMAGE[damage](bad)
    args = {
        "compare": ["compare", str(ok), str(bad)],
        "merge": ["merge", str(tmp_path / "m"), str(bad)],
        "report": ["report", str(bad)],
    }[verb]
    done = harness(*args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1 and str(bad) in lines[0], done.stderr
    assert not (tmp_path / "m").exists()  # a refused merge leaves nothing half-written


def test_one_unreadable_sibling_is_left_out_of_the_history_with_a_warning(tmp_path: Path) -> None:
    ok = good_run(tmp_path / "reports" / "b-ok")
    broken = good_run(tmp_path / "reports" / "a-broken")
    (broken / "results.jsonl").write_text("[not a record]\n" + json.dumps(GOOD_LINE) + "\n")
    done = harness("report", str(ok))
    assert done.returncode in (0, 1), done.stderr
    assert "warning: left out of the history" in done.stderr and "a-broken" in done.stderr
    page = (ok / "index.html").read_text()
    assert "Left out of the history" in page and 'id="history"' in page
