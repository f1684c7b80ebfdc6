"""An item's reason names what really happened: the phase each hung rank was in (the real
``rank_main``, on a stand-in torch), the item's directory removed while it ran, a full disk
(its filesystem, and what fills it) rather than the repro or the environment."""

from __future__ import annotations

import contextlib
import os
import subprocess
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.execution.classify import classify
from harness.execution.launchers import LaunchRequest
from harness.execution.launchers.cell_worker import CellWorker
from harness.records.rank import RankRecord, parse_rank_record
from repros.runtime.outcomes import Outcome
from repros.runtime.record import write_rank_record
from repros.runtime.spec import ReproSpec
from tests.support.fake_stack import this_interpreter
from tests.support.paths import REPO_ROOT

SPEC = ReproSpec(id="T-REASON", title="a stand-in", upstream=(), signatures=(), expectations=(), modes=("bug",))

#: A torch with just what ``rank_main`` touches on a CPU; each hang is chosen by a variable.
FAKE_TORCH = {
    "torch/__init__.py": """
        import types
        class device:
            def __init__(self, kind, index=None):
                self.type = kind
        cuda = types.SimpleNamespace(is_available=lambda: False)
        version = types.SimpleNamespace(cuda=None)
    """,
    "torch/distributed/__init__.py": """
        import os, time
        _ready = False
        def init_process_group(**kwargs):
            global _ready
            if os.environ.get("FAKE_HANG") == "setup":
                time.sleep(600)
            _ready = True
        def is_initialized():
            return _ready
        def destroy_process_group():
            if os.environ.get("FAKE_HANG") == "teardown":
                time.sleep(600)
    """,
}

REPRO = """
import os, time
from repros.runtime.spec import ReproSpec
SPEC = ReproSpec(id="T-HANG", title="hangs where it is told", upstream=(), signatures=(), expectations=(),
                 modes=("bug",))
def run(ctx):
    if os.environ.get("FAKE_HANG") == "run" and ctx.rank == 1:
        time.sleep(600)
"""


@pytest.fixture
def stand_in_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    site = tmp_path / "site"
    for name, text in FAKE_TORCH.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(textwrap.dedent(text))
    monkeypatch.setenv("PYTHONPATH", f"{site}{os.pathsep}{REPO_ROOT}")
    repro = tmp_path / "t_hang.py"
    repro.write_text(textwrap.dedent(REPRO))
    return repro


@contextlib.contextmanager
def _worker(tmp_path: Path, entry: str) -> Iterator[CellWorker]:
    worker = CellWorker(
        this_interpreter("stand-in", tmp_path / "ext"),
        tmp_path / f"worker-{uuid.uuid4().hex}.log",
        server_args=("--preload", "json", "--rank-entry", entry),
    )
    worker.start()
    try:
        yield worker
    finally:
        worker.close()


@pytest.mark.parametrize("phase", ["setup", "run", "teardown"])
def test_a_hung_rank_is_named_in_the_phase_it_hung_in(
    phase: str, stand_in_torch: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_HANG", phase)
    with _worker(tmp_path, "repros.runtime.rank_main:main") as worker:
        result = worker.launch(LaunchRequest(worker.env, str(stand_in_torch), "bug", 2, tmp_path / "item", 5))
    observation = classify("bug", SPEC, result)
    assert observation.outcome == Outcome.HANG, observation
    hung = ["rank 1"] if phase == "run" else ["rank 0", "rank 1"]
    assert all(f"{rank} in {phase}" in observation.reasons[0] for rank in hung), observation.reasons
    if phase == "run":
        assert "rank 0" not in observation.reasons[0]  # it ended: only the rank that hung is named
    record = result.records[1]
    assert record is not None and record.phase == phase  # what the item's record shows for the rank


def test_an_item_whose_directory_is_removed_while_it_runs_is_infra_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    with _worker(tmp_path, "tests.execution.contained_ranks:main") as worker:
        result = worker.launch(LaunchRequest(worker.env, "rmdir", "bug", 2, tmp_path / "item", 30))
    observation = classify("bug", SPEC, result)
    assert observation.outcome == Outcome.INFRA
    assert observation.reasons[0].startswith(f"the item's directory {tmp_path / 'item'} disappeared while")


def _error_record(message: str) -> RankRecord:
    return parse_rank_record(
        {"rank": 0, "status": "error", "phase": "run", "error": {"type": "OSError", "message": message}}
    )


@pytest.mark.parametrize(
    "message", ["[Errno 28] No space left on device: '{run}/ckpt.pt'", "[Errno 122] Disk quota exceeded"]
)
def test_a_rank_that_the_disk_refused_is_infra_naming_the_disk_not_a_different_error(
    message: str, tmp_path: Path
) -> None:
    from harness.execution.launchers.diagnose import mount_of
    from harness.execution.launchers.result import collect_item

    run = tmp_path / "run"
    item = run / "items" / "c" / "item"
    item.mkdir(parents=True)
    message = message.format(run=run)
    write_rank_record(item, 0, _error_record(message))
    (run / "big.log").write_bytes(b"x" * 5000)
    result = collect_item(["x"], item, 1, 1, False, 1.0, [], rank_exitcodes={0: 1}, scan_root=run)
    observation = classify("bug", SPEC, result)
    assert observation.outcome == Outcome.INFRA
    reason = observation.reasons[0]
    assert message.split(":")[0] in reason
    if "ckpt.pt" in message:
        # The filesystem of the file the write was refused on (a rank's write elsewhere is the
        # other disk's: tests/execution/test_ranks_as_run.py), and what fills it.
        assert reason.startswith(f"the disk is full: the filesystem at {mount_of(run)[0]} (")
        assert f"holding {run}/ckpt.pt" in reason and "big.log (4.9 KiB)" in reason
    else:
        assert reason.startswith("a disk a rank wrote to is full (its error names no file")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB filesystem, where this machine lets a test mount one (as root)."""
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here: {made.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_an_item_that_fills_the_disk_is_infra_naming_the_filesystem_and_what_filled_it(
    small_disk: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    run_dir = small_disk / "run"
    item = run_dir / "items" / "c" / "flood"
    with _worker(tmp_path, "tests.execution.contained_ranks:main") as worker:
        request = LaunchRequest(worker.env, "flood:3000000", "bug", 1, item, 60, scan_root=run_dir)
        result = worker.launch(request)
    observation = classify("bug", SPEC, result)
    assert observation.outcome == Outcome.INFRA, observation
    reason = observation.reasons[0]
    assert reason.startswith(f"the disk is full: the filesystem at {small_disk} (tmpfs, holding {item})")
    assert "writing rank0.log failed (No space left on device" in reason
    assert "the largest files under" in reason and "items/c/flood/rank0.log" in reason
