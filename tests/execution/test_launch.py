"""launch_item with real processes: a stand-in torchrun (no torch needed) whose ranks
hang or finish, to prove the timeout kills the whole process group and nothing the
item started outlives it."""

from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path

import pytest

from harness.environments import Environment
from harness.execution.classify import classify
from harness.execution.launchers import LaunchRequest
from harness.execution.launchers.torchrun import launch_item
from repros.catalog.f1_zero3_frozen_ckpt import SPEC as F1
from tests.support.fake_stack import this_interpreter

FAKE_TORCHRUN = """
import argparse, os, subprocess, sys
parser = argparse.ArgumentParser()
parser.add_argument("--standalone", action="store_true")
parser.add_argument("--nnodes")
parser.add_argument("--nproc_per_node", type=int)
parser.add_argument("--max_restarts")
parser.add_argument("-m", dest="module")
args, rest = parser.parse_known_args()
item_dir = rest[rest.index("--item-dir") + 1]
ranks = [
    # Like torchrun: each rank in a session of its own, out of reach of the launcher's group.
    subprocess.Popen([sys.executable, os.environ["FAKE_RANK"], item_dir], env=dict(os.environ, RANK=str(r)),
                     start_new_session=True)
    for r in range(args.nproc_per_node)
]
sys.exit(max(abs(p.wait()) for p in ranks))
"""

FAKE_RANK = """
import json, os, subprocess, sys, time
from pathlib import Path
from repros.runtime.record import write_rank_record
item_dir, rank = Path(sys.argv[1]), int(os.environ["RANK"])
record = {"rank": rank, "pid": os.getpid(), "status": "running", "phase": "run"}
if os.environ["FAKE_BEHAVIOUR"] == "hang":
    # A grandchild too, as a data loader worker would be: it must not survive either.
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    record["facts"] = {"worker_pid": worker.pid}
    write_rank_record(item_dir, rank, record)
    time.sleep(600)
write_rank_record(item_dir, rank, {**record, "status": "ok", "facts": {"train": {}}})
"""


@pytest.fixture()
def fake_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Environment:
    package = tmp_path / "fake" / "torch" / "distributed"
    package.mkdir(parents=True)
    (tmp_path / "fake" / "torch" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "run.py").write_text(textwrap.dedent(FAKE_TORCHRUN))
    rank = tmp_path / "fake_rank.py"
    rank.write_text(textwrap.dedent(FAKE_RANK))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "fake"))
    monkeypatch.setenv("FAKE_RANK", str(rank))
    return this_interpreter("fake", tmp_path / "ext")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes (its parent has not reaped it yet).
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_timeout_kills_every_rank_and_their_children(
    fake_env: Environment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_BEHAVIOUR", "hang")
    started = time.perf_counter()
    result = launch_item(
        LaunchRequest(fake_env, "repros.catalog.f1_zero3_frozen_ckpt", "bug", 2, tmp_path / "item", 4.0)
    )
    assert result.timed_out and time.perf_counter() - started < 20
    pids, workers = [], []
    for rank in (0, 1):
        record = json.loads((tmp_path / "item" / f"rank{rank}.json").read_text())
        pids += [record["pid"], record["facts"]["worker_pid"]]
        workers.append(record["facts"]["worker_pid"])
    time.sleep(0.5)
    assert [pid for pid in pids if alive(pid)] == []
    # The ranks' children were out of the launcher's group's reach; the sweep got them.
    assert set(workers) <= set(result.leftovers_killed)
    assert classify("bug", F1, result).outcome == "HANG"


def test_a_clean_launch_collects_every_rank_record(
    fake_env: Environment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_BEHAVIOUR", "ok")
    result = launch_item(
        LaunchRequest(fake_env, "repros.catalog.f1_zero3_frozen_ckpt", "bug", 3, tmp_path / "item", 60.0)
    )
    assert not result.timed_out and result.returncode == 0
    assert sorted(result.records) == [0, 1, 2]
    assert all(r is not None and r.status == "ok" for r in result.records.values())
    assert classify("bug", F1, result).outcome == "NOT_REPRODUCED"


def test_a_stale_jit_build_lock_is_cleared_only_when_nobody_uses_the_directory(tmp_path: Path) -> None:
    import fcntl

    from harness.execution.launchers.supervision import IN_USE_FILE, extensions_in_use

    baton = tmp_path / "deepspeed_shm_comm" / "lock"
    baton.parent.mkdir(parents=True)
    baton.write_text("")
    with open(tmp_path / IN_USE_FILE, "a") as other:  # another launch holds the directory
        fcntl.flock(other, fcntl.LOCK_SH)
        with extensions_in_use(tmp_path) as removed:
            assert removed == [] and baton.exists()
        fcntl.flock(other, fcntl.LOCK_UN)
    with extensions_in_use(tmp_path) as removed:  # alone: the lock is a killed build's leftover
        assert removed == [str(baton)] and not baton.exists()


ORCHESTRATOR_SCRIPT = """
import sys
from pathlib import Path
from harness.execution.launchers import LaunchRequest
from harness.execution.launchers.torchrun import launch_item
from tests.support.fake_stack import this_interpreter
tmp = Path(sys.argv[1])
launch_item(LaunchRequest(this_interpreter("fake", tmp / "ext"), "repros.catalog.f1_zero3_frozen_ckpt", "bug", 2,
                          tmp / "item", 600.0))
"""


def test_what_a_sigkilled_orchestrator_left_running_is_swept_by_the_next_run(
    fake_env: Environment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess
    import sys

    from harness.execution.containment.leftovers import sweep_dead_runs
    from tests.support.paths import REPO_ROOT

    monkeypatch.setenv("FAKE_BEHAVIOUR", "hang")
    env = {**os.environ, "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{os.environ['PYTHONPATH']}"}
    orchestrator = subprocess.Popen([sys.executable, "-c", ORCHESTRATOR_SCRIPT, str(tmp_path)], cwd=REPO_ROOT, env=env)
    pids: list[int] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(pids) < 4:
        pids = []
        for rank in (0, 1):
            path = tmp_path / "item" / f"rank{rank}.json"
            record = json.loads(path.read_text()) if path.exists() else {}
            pids += [p for p in (record.get("pid"), record.get("facts", {}).get("worker_pid")) if p]
        time.sleep(0.2)
    assert len(pids) == 4, "the hanging item never started"
    orchestrator.kill()
    orchestrator.wait()
    # torchrun died with its orchestrator; its ranks, in sessions of their own, did not: the next
    # run sweeps them (here, or any other run that starts meanwhile on this machine).
    sweep_dead_runs()
    time.sleep(0.5)
    assert [p for p in pids if alive(p)] == []
