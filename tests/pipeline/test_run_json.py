"""``run.json`` at scale and at the end of a run, however it ends: written as the run starts and
as it ends, never once a cell (a run of 10,000 cells rewrote a growing file 10,000 times); each
cell's environment kept even when the orchestrator is killed outright; a run stopped by SIGHUP
(a closed terminal, a cancelled CI job) marked interrupted like one stopped by SIGINT or SIGTERM,
so ``--resume`` and the report tell it from a finished run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.execution.launchers import LaunchRequest
from harness.records.run_dir import CELLS_FILE, RunDir
from harness.records.run_meta import RunMeta
from tests.support import throwaway_run
from tests.support.paths import REPO_ROOT


@pytest.fixture
def meta_writes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """How many cells ``run.json`` held at each write."""
    seen: list[int] = []
    write_meta = RunDir.write_meta

    def counted(self: RunDir, meta: RunMeta) -> None:
        seen.append(len(meta.cells))
        write_meta(self, meta)

    monkeypatch.setattr(RunDir, "write_meta", counted)
    yield seen


def _run_cells(tmp_path: Path, count: int) -> Path:
    cells = [f"c{i}" for i in range(count)]
    matrix = throwaway_run.write_matrix(tmp_path / f"matrix{count}.yaml", cells, world_size=1)
    out = tmp_path / f"run{count}"
    with throwaway_run.registered():
        assert throwaway_run.run(matrix, out, tmp_path / "cache") == 1
    return out


def test_run_json_is_written_as_often_for_forty_cells_as_for_two(tmp_path: Path, meta_writes: list[int]) -> None:
    few = _run_cells(tmp_path, 2)
    writes_few = len(meta_writes)
    meta_writes.clear()
    many = _run_cells(tmp_path, 40)
    assert len(meta_writes) == writes_few <= 3  # the start and the end, not once a cell
    # Written whole at the end: every cell's environment, and nothing left beside it.
    for out, count in ((few, 2), (many, 40)):
        written = json.loads((out / "run.json").read_text())
        assert len(written["cells"]) == count and written["cells"]["c1"]["key"] == throwaway_run.NAME
        assert written["finished_at"] and written["interrupted"] is None
        assert not (out / CELLS_FILE).exists()


_KILLED_RUN = """
import os, signal, sys
from pathlib import Path
from tests.support import throwaway_run

def kill_at_c3(request):
    if request.cell == "c3":
        os.kill(os.getpid(), signal.SIGKILL)

tmp = Path(sys.argv[1])
matrix = throwaway_run.write_matrix(tmp / "matrix.yaml", [f"c{i}" for i in range(6)], world_size=1)
with throwaway_run.registered(on_launch=kill_at_c3):
    throwaway_run.run(matrix, tmp / "run", tmp / "cache")
"""


def test_a_run_killed_outright_keeps_each_cells_environment_and_resumes_whole(tmp_path: Path) -> None:
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_RUN, str(tmp_path)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    out = tmp_path / "run"
    assert [r.cell for r in RunDir(out).records()] == ["c0", "c1", "c2"]
    # run.json is as the run started; the cells made ready since are read from beside it.
    assert json.loads((out / "run.json").read_text()).get("cells", {}) == {}
    assert sorted(RunDir(out).read_meta().cells) == ["c0", "c1", "c2", "c3"]
    with throwaway_run.registered():
        assert throwaway_run.resume(out) == 1
    written = json.loads((out / "run.json").read_text())
    assert sorted(written["cells"]) == [f"c{i}" for i in range(6)] and written["interrupted"] is None
    assert len(RunDir(out).records()) == 6 and not (out / CELLS_FILE).exists()


def _stop_at(cell: str, signum: int) -> Any:
    def stop(request: LaunchRequest) -> None:
        if request.cell == cell:
            os.kill(os.getpid(), signum)

    return stop


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_run_stopped_by_a_signal_is_marked_interrupted_by_it_and_resumes(tmp_path: Path, signum: int) -> None:
    cells = [f"c{i}" for i in range(4)]
    matrix = throwaway_run.write_matrix(tmp_path / "matrix.yaml", cells, world_size=1)
    out = tmp_path / "run"
    name = signal.Signals(signum).name
    # The run as started from a terminal: SIGHUP not ignored, whatever this test process inherited
    # (under ``nohup`` it is ignored, and then the run rightly goes on; see the test below).
    previous = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        with throwaway_run.registered(on_launch=_stop_at("c2", signum)):
            assert throwaway_run.run(matrix, out, tmp_path / "cache") == 130
    finally:
        signal.signal(signal.SIGHUP, previous)
    written = json.loads((out / "run.json").read_text())
    assert written["interrupted"] == name and written["finished_at"]
    assert [r.cell for r in RunDir(out).records()] == ["c0", "c1"]
    assert f"by {name}: some planned items did not run" in (out / "index.html").read_text()
    assert sorted(written["cells"]) == ["c0", "c1", "c2"]
    # --resume runs what is left, and the mark goes.
    with throwaway_run.registered():
        assert throwaway_run.resume(out) == 1
    assert json.loads((out / "run.json").read_text())["interrupted"] is None
    assert len(RunDir(out).records()) == 4


def test_a_run_started_under_nohup_goes_on_after_sighup(tmp_path: Path) -> None:
    matrix = throwaway_run.write_matrix(tmp_path / "matrix.yaml", ["c0", "c1", "c2"], world_size=1)
    out = tmp_path / "run"
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with throwaway_run.registered(on_launch=_stop_at("c1", signal.SIGHUP)):
            assert throwaway_run.run(matrix, out, tmp_path / "cache") == 1
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert json.loads((out / "run.json").read_text())["interrupted"] is None
    assert len(RunDir(out).records()) == 3
