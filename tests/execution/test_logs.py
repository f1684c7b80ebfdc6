"""An item's logs are capped: each keeps its head and its tail with the cut marked, copied with
bounded memory; a disk that refuses the writes is reported as a full disk, not as the item."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.execution.launchers import logs
from harness.execution.launchers.logs import CappedLog, LogPump
from tests.support.paths import REPO_ROOT

_MARKER = re.compile(rb"\n\.\.\. (\d+) bytes cut \.\.\.\n")


def _expected_ends(data: bytes, head: int, tail: int) -> tuple[bytes, bytes]:
    kept_tail = data[len(data) - tail :]
    newline = kept_tail.find(b"\n", 0, 4096)
    return data[:head], kept_tail[newline + 1 :] if newline >= 0 else kept_tail


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    chunks=st.lists(st.binary(min_size=0, max_size=700), max_size=30),
    newlines=st.booleans(),
    head=st.integers(min_value=0, max_value=2000),
    tail=st.integers(min_value=1, max_value=2000),
)
def test_a_log_keeps_its_head_and_tail_and_marks_the_cut(
    tmp_path: Path, chunks: list[bytes], newlines: bool, head: int, tail: int
) -> None:
    if newlines:
        chunks = [c.replace(b"a", b"\n") for c in chunks]
    path = tmp_path / f"rank-{uuid.uuid4().hex}.log"  # one directory for every example
    log = CappedLog(path, head, tail)
    for chunk in chunks:
        log.write(chunk)
        # Bounded while copying: the ring on disk never holds more than the tail.
        assert not log.ring_path.exists() or log.ring_path.stat().st_size <= tail
    log.close()
    data = b"".join(chunks)
    kept = path.read_bytes()
    assert not log.ring_path.exists()
    if len(data) <= head + tail:
        assert kept == data
        return
    start, end = _expected_ends(data, head, tail)
    found = _MARKER.search(kept, len(start))
    assert found is not None and found.start() == len(start)
    assert kept[: len(start)] == start and kept[found.end() :] == end
    assert int(found[1]) == len(data) - len(start) - len(end)  # says exactly what is missing
    assert len(kept) <= head + tail + len(found[0])


def test_a_log_on_a_disk_that_refuses_it_is_disk_full_and_never_raises(tmp_path: Path) -> None:
    log = CappedLog(Path("/dev/full"), 10, 10)
    log.write(b"x" * 100)
    log.write(b"y" * 100)
    log.close()
    assert log.disk_full and log.error is not None and log.lost == 200 and log.received == 200


FLOOD = """
import os, sys
from pathlib import Path
from repros.runtime.record import open_log
fd = open_log(Path(sys.argv[1]))
out = os.fdopen(fd, "w", buffering=1)
for i in range(int(sys.argv[2])):
    out.write(f"line {i:09d} " + "x" * 50 + "\\n")
out.write("the last line\\n")
out.close()
"""


def test_a_process_flooding_its_log_through_the_pipe_leaves_a_capped_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logs, "HEAD_BYTES", 64 * 1024)
    monkeypatch.setattr(logs, "TAIL_BYTES", 256 * 1024)
    path = tmp_path / "rank0.log"
    pump = LogPump()
    assert pump.listen(path)
    pump.start()
    lines = 200_000  # 12 MiB
    subprocess.run(
        [sys.executable, "-c", FLOOD, str(path), str(lines)],
        check=True,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        timeout=120,
    )
    pump.finish()
    kept = path.read_bytes()
    assert kept.startswith(b"line 000000000 ") and kept.endswith(b"the last line\n")
    found = _MARKER.search(kept)
    assert found is not None and len(kept) <= 64 * 1024 + 256 * 1024 + len(found[0])
    assert int(found[1]) + len(kept) - len(found[0]) == lines * 66 + len("the last line\n")
    assert pump.logs[path].received == lines * 66 + len("the last line\n")
    assert not any(p.name.endswith((".pipe", ".tail")) for p in tmp_path.iterdir())


def test_a_log_nobody_listens_for_is_written_directly(tmp_path: Path) -> None:
    path = tmp_path / "rank0.log"
    subprocess.run(
        [sys.executable, "-c", FLOOD, str(path), "3"],
        check=True,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        timeout=60,
    )
    assert path.read_text().endswith("the last line\n")


@pytest.mark.parametrize("launcher", ["worker", "torchrun"])
def test_a_rank_flooding_its_log_leaves_its_head_and_tail_on_disk_and_its_last_line_in_the_record(
    launcher: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness.execution.launchers import LaunchRequest
    from harness.execution.launchers.cell_worker import CellWorker
    from harness.execution.launchers.torchrun import launch_item
    from tests.execution.contained_ranks import FAKE_TORCHRUN
    from tests.support.fake_stack import this_interpreter

    monkeypatch.setattr(logs, "HEAD_BYTES", 100_000)
    monkeypatch.setattr(logs, "TAIL_BYTES", 200_000)
    fake = tmp_path / "fake" / "torch" / "distributed"
    fake.mkdir(parents=True)
    (fake.parent / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    (fake / "run.py").write_text(FAKE_TORCHRUN)
    monkeypatch.setenv("PYTHONPATH", f"{fake.parent.parent}{os.pathsep}{REPO_ROOT}")
    env = this_interpreter("stand-in", tmp_path / "ext")
    request = LaunchRequest(env, "flood:5000000", "bug", 2, tmp_path / "item", 60, cell="c")
    if launcher == "worker":
        worker = CellWorker(
            env,
            tmp_path / "worker.log",
            server_args=("--preload", "json", "--rank-entry", "tests.execution.contained_ranks:main"),
        )
        worker.start()
        try:
            result = worker.launch(request)
        finally:
            worker.close()
    else:
        result = launch_item(request)
    assert result.returncode == 0 and all(r is not None and r.status == "ok" for r in result.records.values())
    for rank in (0, 1):
        kept = (tmp_path / "item" / f"rank{rank}.log").read_bytes()
        found = _MARKER.search(kept)
        assert found is not None and len(kept) <= 300_000 + len(found[0])
        assert kept.startswith(b"line 000000000 ") and kept.endswith(b"the last line of the flood\n")
        assert "the last line of the flood" in result.rank_tails[rank]
    assert result.logs_cut.keys() == {"rank0.log", "rank1.log"}


def test_a_rank_writing_through_the_pipe_still_puts_its_engine_log_beside_its_own(tmp_path: Path) -> None:
    item = tmp_path / "item"
    item.mkdir()
    pump = LogPump()
    assert pump.listen(item / "rank0.log")
    pump.start()
    code = (
        "import os, sys; from pathlib import Path; from repros.runtime.record import open_log; "
        "os.dup2(open_log(Path(sys.argv[1])), 1); "
        "from repros.trainer.weight_sync import engine_log_path; sys.stderr.write(str(engine_log_path('/fallback')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(item / "rank0.log")],
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        check=True,
    )
    pump.finish()
    assert out.stderr == str(item / "vllm-engine.log")
