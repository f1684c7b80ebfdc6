"""On a GPU the cell's worker must stay safe to fork: a module whose import initialises CUDA
(bitsandbytes does, asking torch for the devices' compute capability) is found and left to the
ranks, and every other module is still imported once, in the worker.

Driven for real with a stand-in torch whose CUDA a test can watch (``tests/support/fake_cuda``)
and the stand-in rank entry: no GPU and no real torch needed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.execution.launchers import LaunchRequest
from harness.execution.launchers.cell_worker import CellWorker
from tests.support.fake_stack import this_interpreter
from tests.support.paths import REPO_ROOT

FAKE_CUDA = REPO_ROOT / "tests" / "support" / "fake_cuda"
PRELOAD = "torch,harmless,uses_cuda_at_import,json"


@pytest.fixture(autouse=True)
def stand_ins_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO_ROOT), str(FAKE_CUDA)]))


def _worker(tmp_path: Path, preload: str) -> CellWorker:
    args = ("--preload", preload, "--rank-entry", "tests.support.stand_in_rank:main")
    return CellWorker(this_interpreter("stand-in", tmp_path / "ext"), tmp_path / "worker.log", server_args=args)


def test_a_module_that_initialises_cuda_is_left_to_the_ranks_and_they_fork_warm(tmp_path: Path) -> None:
    worker = _worker(tmp_path, PRELOAD)
    info = worker.start()
    try:
        assert info.cuda is True
        assert info.hazards == []  # the worker forks: no fallback to torchrun
        assert set(info.preloaded) == {"torch", "harmless", "json"}
        assert list(info.deferred) == ["uses_cuda_at_import"]
        # The reason names the call that initialised CUDA, in the module that made it.
        assert "cuda_at_import.py" in info.deferred["uses_cuda_at_import"]
        launch = worker.launch(LaunchRequest(worker.env, "cuda", "bug", 2, tmp_path / "item", 30, cell="stand-in"))
    finally:
        worker.close()
    assert launch.launcher == "worker" and launch.returncode == 0
    for rank in (0, 1):
        facts = launch.records[rank].facts
        assert facts["cuda_initialized_at_start"] is False
        assert facts["preimported"] == ["harmless"]  # the safe module came with the fork
        assert facts["cuda_usable"] is True  # the rank initialised its own CUDA


def test_without_cuda_devices_every_module_is_imported_at_once(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_CUDA_DEVICES", "0")
    worker = _worker(tmp_path, PRELOAD)
    info = worker.start()
    worker.close()
    assert info.cuda is False and info.deferred == {}
    assert set(info.preloaded) == {"torch", "harmless", "uses_cuda_at_import", "json"}


def test_a_probe_that_dies_importing_a_module_leaves_it_to_the_ranks_and_goes_on(tmp_path: Path) -> None:
    worker = _worker(tmp_path, "torch,dies_at_import,harmless")
    info = worker.start()
    worker.close()
    assert info.hazards == []
    assert "died" in info.deferred["dies_at_import"]
    assert set(info.preloaded) == {"torch", "harmless"}
