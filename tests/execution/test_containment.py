"""Nothing an item starts outlives it, under either launcher, with a cgroup per item or without
one (the subreaper fallback); nothing outlives a SIGKILLed orchestrator either, and the next run
cleans what is left (its /dev/shm segments, by the dead items' rendezvous) and says precisely what.

The processes here escape every sweep but containment: a double fork into a session of its own
with an empty environment (no token, no orchestrator marker)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.environments import Environment
from harness.execution.containment import cgroups
from harness.execution.containment.cgroups import ItemCgroup
from harness.execution.containment.leftovers import sweep_dead_runs
from harness.execution.launchers import LaunchRequest, LaunchResult
from harness.execution.launchers.cell_worker import CellWorker
from harness.execution.launchers.torchrun import launch_item
from repros.runtime.lifeline import ORCHESTRATOR_VARIABLE, children, orchestrator_marker
from tests.execution.contained_ranks import FAKE_TORCHRUN
from tests.support.fake_stack import this_interpreter
from tests.support.paths import REPO_ROOT

RANK_ENTRY = ("--preload", "json", "--rank-entry", "tests.execution.contained_ranks:main")
HAVE_CGROUPS = cgroups.base()[0] is not None
ISOLATION = [
    pytest.param("cgroup", marks=pytest.mark.skipif(not HAVE_CGROUPS, reason=f"no item cgroups: {cgroups.describe()}")),
    "fallback",
]


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _no_cgroups(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ItemCgroup, "create", classmethod(lambda cls, orchestrator, token: None))


@pytest.fixture
def fake_torchrun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Environment:
    run = tmp_path / "fake" / "torch" / "distributed"
    run.mkdir(parents=True)
    (tmp_path / "fake" / "torch" / "__init__.py").write_text("")
    (run / "__init__.py").write_text("")
    (run / "run.py").write_text(textwrap.dedent(FAKE_TORCHRUN))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path / 'fake'}{os.pathsep}{REPO_ROOT}")
    return this_interpreter("fake", tmp_path / "ext")


@pytest.fixture
def worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[CellWorker]:
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    w = CellWorker(this_interpreter("stand-in", tmp_path / "ext"), tmp_path / "worker.log", server_args=RANK_ENTRY)
    w.start()
    yield w
    w.close()


def _daemons(result: LaunchResult) -> list[int]:
    return [int(rec.facts["daemon"]) for rec in result.records.values() if rec is not None]


@pytest.mark.parametrize("isolation", ISOLATION)
def test_a_daemon_that_left_everything_is_killed_with_its_item_under_the_worker(
    isolation: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, worker: CellWorker
) -> None:
    if isolation == "fallback":
        _no_cgroups(monkeypatch)
    result = worker.launch(LaunchRequest(worker.env, "daemon", "bug", 2, tmp_path / "item", 30, cell="c"))
    daemons = _daemons(result)
    assert len(daemons) == 2 and result.returncode == 0
    time.sleep(0.2)
    assert [d for d in daemons if alive(d)] == []
    assert set(daemons) <= set(result.leftovers_killed)


@pytest.mark.parametrize("isolation", ISOLATION)
def test_a_daemon_that_left_everything_is_killed_with_its_item_under_torchrun(
    isolation: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_torchrun: Environment
) -> None:
    if isolation == "fallback":
        _no_cgroups(monkeypatch)
    result = launch_item(LaunchRequest(fake_torchrun, "daemon", "bug", 2, tmp_path / "item", 30))
    daemons = _daemons(result)
    assert len(daemons) == 2 and result.returncode == 0, result.launcher_tail
    time.sleep(0.2)
    assert [d for d in daemons if alive(d)] == []
    assert set(daemons) <= set(result.leftovers_killed)


@pytest.mark.parametrize("isolation", ISOLATION)
@pytest.mark.parametrize("launcher", ["worker", "torchrun"])
def test_a_hung_item_and_its_daemons_are_killed_at_the_timeout(
    launcher: str, isolation: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    if isolation == "fallback":
        _no_cgroups(monkeypatch)
    item = LaunchRequest(request.getfixturevalue("fake_torchrun"), "daemon-hang", "bug", 2, tmp_path / "item", 4)
    if launcher == "worker":
        worker = request.getfixturevalue("worker")
        result = worker.launch(LaunchRequest(worker.env, "daemon-hang", "bug", 2, tmp_path / "item", 4, cell="c"))
    else:
        result = launch_item(item)
    assert result.timed_out
    daemons = _daemons(result)
    pids = daemons + [rec.pid for rec in result.records.values() if rec and rec.pid]
    time.sleep(0.2)
    assert len(pids) == 4 and [p for p in pids if alive(p)] == []
    assert set(daemons) <= set(result.leftovers_killed)  # killed by the item's end, and said


ORCHESTRATOR = """
import sys, threading, time
from pathlib import Path
from harness.execution.containment import leftovers
from harness.execution.containment.cgroups import ItemCgroup
from harness.execution.launchers import LaunchRequest
from harness.execution.launchers.cell_worker import CellWorker
from harness.execution.launchers.torchrun import launch_item
from tests.support.fake_stack import this_interpreter
from harness.execution.containment import leftovers
tmp, launcher, isolation, behaviour = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
leftovers.LEDGER_DIR = tmp / "ledger"  # this test's own: other runs on the machine sweep the shared one
if isolation == "fallback":
    ItemCgroup.create = classmethod(lambda cls, orchestrator, token: None)
env = this_interpreter("stand-in", tmp / "ext")
request = LaunchRequest(env, behaviour, "bug", 2, tmp / "item", 600.0, cell="c")
if launcher == "worker":
    worker = CellWorker(env, tmp / "worker.log", server_args=tuple(sys.argv[5:]))
    worker.start()
    threading.Thread(target=worker.launch, args=(request,), daemon=True).start()
else:
    threading.Thread(target=launch_item, args=(request,), daemon=True).start()
time.sleep(600)
"""


def _start_and_kill_orchestrator(
    tmp_path: Path, launcher: str, isolation: str, behaviour: str, freeze_its_children: bool = False
) -> list[dict]:
    """Start an orchestrator whose item hangs, wait for both ranks' records, SIGKILL it.
    ``freeze_its_children``: stop its children first (the lifeline, or the cell's worker), as a
    loaded machine may leave them unscheduled while the next run's sweep comes."""
    fake = os.environ.get("PYTHONPATH", "")
    orchestrator = subprocess.Popen(
        [sys.executable, "-c", ORCHESTRATOR, str(tmp_path), launcher, isolation, behaviour, *RANK_ENTRY],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": f"{fake}{os.pathsep}{REPO_ROOT}" if fake else str(REPO_ROOT)},
    )
    records: list[dict] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(records) < 2:
        records = []
        for rank in (0, 1):
            path = tmp_path / "item" / f"rank{rank}.json"
            record = json.loads(path.read_text()) if path.exists() else {}
            if record.get("facts"):
                records.append(record)
        time.sleep(0.2)
    assert len(records) == 2, "the hanging item never started"
    if freeze_its_children:
        for child in children(orchestrator.pid):
            os.kill(child, signal.SIGSTOP)
    orchestrator.send_signal(signal.SIGKILL)
    orchestrator.wait()
    return records


def _gone_within(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.2)
    return [p for p in pids if alive(p)]


@pytest.mark.parametrize("isolation", ISOLATION)
@pytest.mark.parametrize("launcher", ["worker", "torchrun"])
def test_a_sigkilled_orchestrator_takes_its_items_daemons_with_it(
    launcher: str, isolation: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if launcher == "torchrun":
        request.getfixturevalue("fake_torchrun")
    records = _start_and_kill_orchestrator(tmp_path, launcher, isolation, "daemon-hang")
    pids = [r["facts"]["daemon"] for r in records] + [r["pid"] for r in records]
    # Not left for the next run: the item's reaper kills what it holds when its orchestrator dies.
    assert _gone_within(pids, 15) == []


@pytest.mark.parametrize("launcher", ["worker", "torchrun"])
def test_the_next_runs_sweep_takes_the_daemons_a_killed_runs_reaper_adopted(
    launcher: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Two runs share the machine; one is SIGKILLed and the other's sweep comes before the dead
    run's reaper has looked: the sweep kills the reaper's descendants (the daemons it adopted,
    which carry no marker) before the reaper, never leaving them to init."""
    if launcher == "torchrun":
        request.getfixturevalue("fake_torchrun")
    records = _start_and_kill_orchestrator(tmp_path, launcher, "fallback", "daemon-hang", freeze_its_children=True)
    daemons = [r["facts"]["daemon"] for r in records]
    pids = daemons + [r["pid"] for r in records]
    try:
        swept = sweep_dead_runs(shm_dir=tmp_path / "shm", ledger=tmp_path / "ledger")
        assert _gone_within(pids, 5) == []
        assert set(daemons) <= set(swept.processes)
        assert all(f"{pid} sleep 600" in swept.describe() for pid in daemons)
    finally:
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("launcher", ["worker", "torchrun"])
def test_the_next_run_removes_a_killed_runs_shared_memory_at_once_and_says_what(
    launcher: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    if launcher == "torchrun":
        request.getfixturevalue("fake_torchrun")
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setenv("FAKE_SHM_DIR", str(shm))
    unrelated = shm / "deepspeed_allreduce_buffer_0_127.0.0.1_1_0"  # no dead item's: young, kept
    unrelated.write_bytes(b"\0")
    records = _start_and_kill_orchestrator(tmp_path, launcher, "fallback", "shm-hang")
    segments = sorted(r["facts"]["segment"] for r in records)
    assert _gone_within([r["pid"] for r in records], 15) == []
    assert sorted(p.name for p in shm.iterdir()) == sorted([*segments, unrelated.name])
    # Well within the minute's grace that segments of no known item get.
    swept = sweep_dead_runs(shm_dir=shm, ledger=tmp_path / "ledger")
    assert sorted(swept.shm_segments) == segments
    assert sorted(p.name for p in shm.iterdir()) == [unrelated.name]
    assert all(name in swept.describe() for name in segments)
    assert swept.as_record()["shm_segments"] == swept.shm_segments and swept.runs
    assert not (tmp_path / "ledger").exists() or list((tmp_path / "ledger").iterdir()) == []


def test_a_dead_runs_process_is_killed_and_named_with_its_command(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    marker = orchestrator_marker(os.getpid()).split(":")[0]
    dead_marker = f"{dead.pid}:1"  # a process that is not alive with that start
    assert marker
    orphan = subprocess.Popen(
        ["sleep", "600"], env={**os.environ, ORCHESTRATOR_VARIABLE: dead_marker}, start_new_session=True
    )
    try:
        swept = sweep_dead_runs(shm_dir=tmp_path)
        assert orphan.pid in swept.processes
        assert dead_marker in swept.runs
        assert f"{orphan.pid} sleep 600" in swept.describe()
        assert swept.as_record()["commands"][str(orphan.pid)] == "sleep 600"
    finally:
        orphan.kill()
        orphan.wait()


def test_a_dead_runs_process_that_holds_a_live_runs_process_loses_only_itself(tmp_path: Path) -> None:
    live = orchestrator_marker(os.getpid())
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    holder = subprocess.Popen(
        ["bash", "-c", f"env {ORCHESTRATOR_VARIABLE}={live} sleep 600 & wait"],
        env={**os.environ, ORCHESTRATOR_VARIABLE: f"{dead.pid}:1"},
        start_new_session=True,
    )

    def started() -> list[int]:  # exec'd: its environment is the live run's now
        return [p for p in children(holder.pid) if Path(f"/proc/{p}/cmdline").read_bytes() == b"sleep\x00600\x00"]

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not started():
        time.sleep(0.05)
    inside = started()
    try:
        assert inside, "the live run's stand-in never started"
        swept = sweep_dead_runs(shm_dir=tmp_path)
        holder.wait(10)
        assert holder.pid in swept.processes and not set(inside) & set(swept.processes)
        assert [p for p in inside if alive(p)] == inside
    finally:
        for pid in [holder.pid, *inside]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        holder.wait()


@pytest.mark.parametrize("launcher", ["worker", "torchrun"])
def test_an_interrupt_kills_every_item_in_flight_with_its_daemons(
    launcher: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    import threading

    from harness.execution.launchers import groups_in_flight, kill_in_flight

    _no_cgroups(monkeypatch)  # the harder case: no cgroup to kill them by
    env = request.getfixturevalue("fake_torchrun")
    results: list[LaunchResult] = []
    if launcher == "worker":
        worker = request.getfixturevalue("worker")
        item = LaunchRequest(worker.env, "daemon-hang", "bug", 2, tmp_path / "item", 600, cell="c")
        thread = threading.Thread(target=lambda: results.append(worker.launch(item)))
    else:
        item = LaunchRequest(env, "daemon-hang", "bug", 2, tmp_path / "item", 600)
        thread = threading.Thread(target=lambda: results.append(launch_item(item)))
    thread.start()
    deadline = time.monotonic() + 60
    records: list[dict] = []
    while time.monotonic() < deadline and len(records) < 2:
        paths = [tmp_path / "item" / f"rank{rank}.json" for rank in (0, 1)]
        records = [r for r in (json.loads(p.read_text()) if p.exists() else {} for p in paths) if r.get("facts")]
        time.sleep(0.2)
    assert len(records) == 2, "the hanging item never started"
    # The ranks can write before the launching thread has taken the worker's "started" (a loaded
    # machine): the interrupt under test is one that comes once the orchestrator knows the item.
    while time.monotonic() < deadline and not groups_in_flight():
        time.sleep(0.05)
    assert groups_in_flight(), "the orchestrator never learnt that the item started"
    assert kill_in_flight()
    thread.join(60)
    pids = [r["facts"]["daemon"] for r in records] + [r["pid"] for r in records]
    assert not thread.is_alive() and _gone_within(pids, 5) == []
