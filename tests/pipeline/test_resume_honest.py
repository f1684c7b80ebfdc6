"""A resumed or interrupted run describes itself as it is (issue 40, class 2): ``--resume`` refuses a
matrix edited since the run started (one line, nothing written); every attempt of ``--repeat`` that
finished is in a record, kept with its own even when the run stops before the item's, and a resume
goes on from those attempts; nothing an interrupted run left (an attempt cut short, a half-written
file) is left beside a resumed run's records."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from harness.execution.launchers import LaunchRequest
from harness.records.run_dir import RunDir
from tests.support import throwaway_run


def test_resume_refuses_a_matrix_edited_since_the_run_started(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    matrix = throwaway_run.write_matrix(tmp_path / "matrix.yaml", ["c0", "c1"], world_size=1)
    out = tmp_path / "run"
    with throwaway_run.registered(on_launch=_stop_at_cell("c1")):
        assert throwaway_run.run(matrix, out, tmp_path / "cache") == 130
    before = (out / "run.json").read_text(), (out / "results.jsonl").read_text()
    matrix.write_text(matrix.read_text().replace("c1:", "c9:"))  # a cell renamed: another plan
    capsys.readouterr()
    with throwaway_run.registered():
        assert throwaway_run.resume(out) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "has changed since run" in err and str(matrix) in err
    assert "put the file back as it was to resume, or start a new run" in err
    assert ((out / "run.json").read_text(), (out / "results.jsonl").read_text()) == before


def _stop_at_cell(cell: str) -> object:
    def stop(request: LaunchRequest) -> None:
        if request.cell == cell:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1.0)  # the run is stopping while this attempt ends

    return stop


def test_a_repeat_stopped_midway_keeps_every_finished_attempt_and_the_resume_goes_on_from_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    matrix = throwaway_run.write_matrix(tmp_path / "matrix.yaml", ["c0"], world_size=1)
    out = tmp_path / "run"
    launches: list[str] = []

    def third_attempt_stops_the_run(request: LaunchRequest) -> None:
        launches.append(request.cell)
        if len(launches) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1.0)

    with throwaway_run.registered(on_launch=third_attempt_stops_the_run):
        assert throwaway_run.run(matrix, out, tmp_path / "cache", "--repeat", "4") == 130
    assert RunDir(out).records() == []  # the item has no record yet...
    written = json.loads((out / "run.json").read_text())
    (kept,) = written["unrecorded_attempts"].values()  # ...but both finished attempts are in one each
    assert [Path(d).name for d in kept] == ["F1-bug.attempt-1", "F1-bug.attempt-2"]
    for number, directory in enumerate(kept, 1):
        attempt = json.loads((Path(directory) / "attempt.json").read_text())
        assert attempt["item_dir"] == directory and attempt["outcome"] == "NOT_REPRODUCED", number
    assert "2 finished attempts of 1 of them kept" in capsys.readouterr().out
    # The attempt cut short, and a half-written file of the stopped run, no record points to.
    (out / "run.json.tmp4242").write_text("{")
    (out / "items" / "c0" / "F1-bug.attempt-2" / "rank0.json.tmp77").write_text("{")

    launches.clear()
    with throwaway_run.registered(on_launch=lambda request: launches.append(request.cell)):
        assert throwaway_run.resume(out) in (0, 1)
    assert launches == ["c0", "c0"]  # attempts 3 and 4 only
    (record,) = RunDir(out).records()
    assert record.repeat == 4 and [Path(a.item_dir or "").name for a in record.attempts] == [
        "F1-bug.attempt-1",
        "F1-bug.attempt-2",
        "F1-bug.attempt-3",
        "F1-bug",
    ]
    # Every directory of the item is one a record points to; nothing half-written is left.
    on_disk = sorted(p.name for p in (out / "items" / "c0").iterdir())
    assert on_disk == sorted(Path(a.item_dir or "").name for a in record.attempts)
    assert not [p for p in out.rglob("*") if ".tmp" in p.name]
    assert json.loads((out / "run.json").read_text())["unrecorded_attempts"] == {}


def test_a_resume_removes_what_the_stopped_runs_writes_left_half_done(tmp_path: Path) -> None:
    matrix = throwaway_run.write_matrix(tmp_path / "matrix.yaml", ["c0", "c1"], world_size=1)
    out = tmp_path / "run"
    with throwaway_run.registered(on_launch=_stop_at_cell("c1")):
        assert throwaway_run.run(matrix, out, tmp_path / "cache") == 130
    partial = [
        out / "run.json.tmp31337",
        out / "index.html.tmp",
        out / "junit.xml.tmp",
        out / "items" / "c0" / "F1-bug" / "rank0.json.tmp999",
    ]
    for path in partial:
        path.write_text("half")
    with throwaway_run.registered():
        assert throwaway_run.resume(out) in (0, 1)
    assert [p for p in partial if p.exists()] == []
    assert len(RunDir(out).records()) == 2
