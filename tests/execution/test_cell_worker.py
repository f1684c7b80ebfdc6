"""The cell's pre-imported worker, driven for real with a stand-in rank entry (no torch).

Each item must be a fresh fork with torchrun's environment and a rendezvous of its own,
in a session of its own; a crash, a failure or a hang in one item must not touch the
next; a worker that dies is replaced; one that cannot start leaves the cell to torchrun.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from harness.environments import Environment
from harness.execution.containment import cgroups
from harness.execution.containment.processes import TOKEN_VARIABLE, processes_in_session
from harness.execution.launchers import LaunchRequest
from harness.execution.launchers.cell_worker import MAX_LIVE_FOR_AHEAD, CellWorker, WorkerGone, WorkerPool
from repros.runtime.cell_server import fork_hazards
from tests.support.fake_stack import this_interpreter
from tests.support.paths import REPO_ROOT

SERVER_ARGS = ("--preload", "json", "--rank-entry", "tests.support.stand_in_rank:main")


def _env(tmp_path: Path) -> Environment:
    return this_interpreter("stand-in", tmp_path / "ext")


def item(env: Environment, behaviour: str, world_size: int, item_dir: Path, timeout_s: float) -> LaunchRequest:
    """An item for the stand-in rank entry: ``behaviour`` in place of a repro module."""
    return LaunchRequest(env, behaviour, "bug", world_size, item_dir, timeout_s, cell="stand-in")


@pytest.fixture(autouse=True)
def stand_in_ranks_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    # The stand-in rank entry lives in tests/: the passthrough cell keeps the caller's PYTHONPATH.
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))


@pytest.fixture
def worker(tmp_path: Path):
    w = CellWorker(_env(tmp_path), tmp_path / "worker.log", server_args=SERVER_ARGS)
    w.start()
    yield w
    w.close()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_each_item_gets_fresh_ranks_with_torchruns_environment_in_a_session_of_its_own(worker, tmp_path) -> None:
    first = worker.launch(item(worker.env, "env", 2, tmp_path / "a", 30))
    second = worker.launch(item(worker.env, "env", 2, tmp_path / "b", 30))
    assert first.launcher == "worker" and first.returncode == 0 and not first.timed_out
    ranks = [first.records[0], first.records[1]]
    assert all(r is not None for r in ranks)
    assert [r.facts["env"]["RANK"] for r in ranks] == ["0", "1"]
    assert {r.facts["env"]["WORLD_SIZE"] for r in ranks} == {"2"}
    assert {r.facts["env"]["LOCAL_SIZE"] for r in ranks} == {"2"}
    assert {r.facts["env"]["OMP_NUM_THREADS"] for r in ranks} == {"1"}
    assert len({r.facts["env"]["MASTER_PORT"] for r in ranks}) == 1
    assert all(r.facts["env"][TOKEN_VARIABLE] for r in ranks)
    # One session per item, neither the worker's nor the other item's.
    sessions = {r.facts["session"] for r in ranks}
    assert len(sessions) == 1 and sessions != {second.records[0].facts["session"]}
    assert os.getsid(worker.info.pid) not in sessions
    assert {r.pid for r in ranks}.isdisjoint({r.pid for r in second.records.values()})
    assert first.records[0].facts["env"][TOKEN_VARIABLE] != second.records[0].facts["env"][TOKEN_VARIABLE]


def test_a_killed_rank_is_named_its_peer_is_stopped_and_the_next_item_is_untouched(worker, tmp_path) -> None:
    started = time.perf_counter()
    crashed = worker.launch(item(worker.env, "kill1", 2, tmp_path / "a", 60))
    assert crashed.rank_exitcodes == {1: -signal.SIGKILL}  # rank 0, stopped by the leader, is not blamed
    assert crashed.returncode == 1 and time.perf_counter() - started < 30
    after = worker.launch(item(worker.env, "ok", 2, tmp_path / "b", 30))
    assert after.returncode == 0 and [r.status for r in after.records.values()] == ["ok", "ok"]
    assert worker.alive


def test_a_failing_rank_ends_the_item_at_once(worker, tmp_path) -> None:
    started = time.perf_counter()
    failed = worker.launch(item(worker.env, "raise", 2, tmp_path / "a", 60))
    assert failed.rank_exitcodes == {0: 1} and failed.records[0].status == "error"
    assert time.perf_counter() - started < 30


def test_a_hung_item_is_killed_at_its_timeout_with_every_process_it_started(worker, tmp_path) -> None:
    hung = worker.launch(item(worker.env, "hang", 2, tmp_path / "a", 3))
    assert hung.timed_out and hung.returncode is None
    session = hung.records[0].facts["session"]
    children = [hung.records[r].facts.get("child") for r in (0, 1)]
    assert all(children)
    assert processes_in_session(session) == []
    assert not any(_alive(pid) for pid in children)
    assert worker.alive and worker.launch(item(worker.env, "ok", 1, tmp_path / "b", 30)).returncode == 0


def test_a_worker_that_dies_mid_item_is_replaced(tmp_path) -> None:
    pool = WorkerPool(tmp_path / "workers", server_args=SERVER_ARGS)
    env = _env(tmp_path)
    try:
        worker = pool.get(env, "cell")
        assert worker is not None
        first_pid = worker.info.pid
        threading.Timer(1.0, lambda: os.kill(first_pid, signal.SIGKILL)).start()
        result = worker.launch(item(worker.env, "hang", 2, tmp_path / "a", 60))
        assert not result.timed_out and "worker died" in result.launcher_tail
        assert processes_in_session(result.records[0].facts["session"]) == []
        replacement = pool.get(env, "cell")
        assert replacement is not None and replacement.info.pid != first_pid
        assert replacement.launch(item(replacement.env, "ok", 2, tmp_path / "b", 30)).returncode == 0
    finally:
        pool.close()


def test_a_worker_that_cannot_start_leaves_its_cell_to_torchrun_saying_why(tmp_path) -> None:
    pool = WorkerPool(tmp_path / "workers", server_args=("--no-such-option",))
    env = _env(tmp_path)
    assert pool.get(env, "cell") is None
    assert "exited before it was ready" in pool.reason(env) and "--no-such-option" in pool.reason(env)
    assert pool.unavailable_by_cell() == {"cell": pool.reason(env)}


def test_threads_running_at_fork_time_are_a_hazard() -> None:
    release = threading.Event()
    thread = threading.Thread(target=release.wait)
    thread.start()
    try:
        assert any("threads" in h for h in fork_hazards())
    finally:
        release.set()
        thread.join()


def test_the_pool_closes_the_least_recently_used_idle_workers(tmp_path) -> None:
    pool = WorkerPool(tmp_path / "workers", server_args=SERVER_ARGS, max_idle=1)  # one live at a time
    envs = [replace(_env(tmp_path), key=f"cell{i}") for i in range(3)]
    try:
        workers = [pool.get(env, env.key) for env in envs]
        assert all(w is not None for w in workers)
        assert [w.alive for w in workers] == [False, False, True]
        again = pool.get(envs[0], "cell0")  # started anew; the idle one is closed to stay within one
        assert again is not None and again.alive and again is not workers[0] and not workers[2].alive
        assert again.launch(item(again.env, "ok", 1, tmp_path / "a", 30)).returncode == 0
    finally:
        pool.close()


def test_an_item_sent_to_a_closed_worker_is_refused_before_anything_runs(worker, tmp_path) -> None:
    worker.close()
    with pytest.raises(WorkerGone):
        worker.launch(item(worker.env, "ok", 1, tmp_path / "a", 30))
    assert not (tmp_path / "a" / "rank0.json").exists()


def test_a_stale_build_lock_is_cleared_when_the_worker_starts_and_recorded(tmp_path) -> None:
    lock = tmp_path / "ext" / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir(parents=True)
    lock.write_text("")
    worker = CellWorker(_env(tmp_path), tmp_path / "worker.log", server_args=SERVER_ARGS)
    try:
        info = worker.start()
        assert info.stale_build_locks_removed == [str(lock)] and not lock.exists()
    finally:
        worker.close()


ORCHESTRATOR_SCRIPT = """
import sys, threading, time
from pathlib import Path
from harness.execution.launchers import LaunchRequest
from harness.execution.launchers.cell_worker import CellWorker
from tests.support.fake_stack import this_interpreter
tmp = Path(sys.argv[1])
env = this_interpreter("stand-in", tmp / "ext")
worker = CellWorker(env, tmp / "worker.log", server_args=tuple(sys.argv[2:]))
worker.start()
(tmp / "worker.pid").write_text(str(worker.info.pid))
request = LaunchRequest(env, "hang", "bug", 2, tmp / "item", 600.0, cell="stand-in")
threading.Thread(target=worker.launch, args=(request,), daemon=True).start()
time.sleep(600)
"""


def test_a_sigkilled_orchestrator_takes_its_worker_leader_ranks_and_their_children_with_it(tmp_path) -> None:
    import json
    import subprocess
    import sys

    orchestrator = subprocess.Popen(
        [sys.executable, "-c", ORCHESTRATOR_SCRIPT, str(tmp_path), *SERVER_ARGS],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    pids: list[int] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(pids) < 4:
        pids = []
        for rank in (0, 1):
            path = tmp_path / "item" / f"rank{rank}.json"
            record = json.loads(path.read_text()) if path.exists() else {}
            pids += [p for p in (record.get("pid"), record.get("facts", {}).get("child")) if p]
        time.sleep(0.2)
    assert len(pids) == 4, "the hanging item never started"
    worker_pid = int((tmp_path / "worker.pid").read_text())
    pids.append(worker_pid)
    orchestrator.send_signal(signal.SIGKILL)
    orchestrator.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.2)
    assert [p for p in pids if _alive(p)] == []


@pytest.mark.skipif(cgroups.base()[0] is None, reason=f"no item cgroups here: {cgroups.describe()}")
def test_a_daemon_that_left_the_session_and_cleared_its_environment_is_killed_with_the_item(worker, tmp_path) -> None:
    result = worker.launch(item(worker.env, "daemon", 2, tmp_path / "a", 30))
    daemons = [r.facts["daemon"] for r in result.records.values() if r]
    assert len(daemons) == 2
    assert [d for d in daemons if _alive(d)] == []
    assert set(daemons) <= set(result.leftovers_killed)


def test_a_retired_worker_takes_no_more_items_and_the_pool_waits_for_it_only_at_its_close(tmp_path) -> None:
    """A run changing cells does not wait for the last cell's worker to exit; the run's end does."""
    pool = WorkerPool(tmp_path / "workers", server_args=SERVER_ARGS)
    env = _env(tmp_path)
    worker = pool.get(env, "stand-in")
    assert worker is not None and worker.info is not None
    pid = worker.info.pid
    pool.retire(env)
    assert not worker.alive  # at once: no item goes to it, and the next get starts another
    with pytest.raises(WorkerGone):
        worker.launch(item(env, "ok", 1, tmp_path / "a", 30))
    fresh = pool.get(env, "stand-in")
    assert fresh is not None and fresh is not worker and fresh.alive
    pool.close()
    assert not _alive(pid) and not fresh.alive


def test_queued_cells_workers_start_ahead_of_their_first_items_a_few_at_a_time(tmp_path) -> None:
    """While one cell's items run, the next queued cells' workers start, so their first items do not
    wait for the imports; never more than ``MAX_LIVE_FOR_AHEAD`` alive at once."""
    pool = WorkerPool(tmp_path / "workers", server_args=SERVER_ARGS)
    envs = [replace(_env(tmp_path), key=f"cell{i}") for i in range(MAX_LIVE_FOR_AHEAD + 1)]
    names = [env.key for env in envs]
    try:
        running = pool.get(envs[0], names[0])
        assert running is not None
        for env in envs[1:]:
            pool.prepare(env, env.key)
        deadline = time.monotonic() + 60
        while len(pool.started_by_cell()) < MAX_LIVE_FOR_AHEAD and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
        assert set(pool.started_by_cell()) == set(names[:MAX_LIVE_FOR_AHEAD])  # the last waits for room
        ahead = pool.get(envs[1], names[1])
        assert ahead is not None and ahead.info is not None
        assert ahead.info.pid == pool.started_by_cell()[names[1]].pid  # the one started ahead
        pool.retire(envs[0])  # the first cell is done: the last one's starts now
        while names[-1] not in pool.started_by_cell() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert names[-1] in pool.started_by_cell()
        assert ahead.launch(item(ahead.env, "ok", 1, tmp_path / "a", 30)).returncode == 0
    finally:
        pool.close()
    assert not any(w.alive for w in [running, ahead])
