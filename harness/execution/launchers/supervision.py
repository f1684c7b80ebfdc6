"""What every launcher does around an item, whatever starts its ranks.

* The ranks' environment: the cell's interpreter sees the worker package (``repros``) and
  nothing else of the orchestrator's (``worker_root``), one OpenMP thread a rank (the
  scheduler counts one core a rank), offline hubs, and DeepSpeed told the local size.
* The item's process group is tracked while it runs, so an interrupt kills every item in
  flight (``kill_in_flight``).
* The environment's JIT directory is held while an item uses it; a build lock left by a
  killed build is cleared when nobody else uses the directory (``extensions_in_use``).
* On timeout, what each rank was doing is read from its record (the phase it had entered, or
  that it outlived its final record), each rank is asked for its Python stacks, then the group
  is terminated and, where it does not end, killed (``stop_timed_out_item``).
* The item's first process (the lifeline under torchrun, the leader under a cell's worker) is
  its subreaper: whatever the item left is its descendant, and is killed before it
  (``end_item_tree``), so nothing escapes by leaving the item's session, cgroup or environment.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import repros
from harness.environments import Environment, provider_class
from harness.execution.containment.cgroups import ItemCgroup
from harness.execution.containment.processes import TOKEN_VARIABLE
from harness.records.rank import read_rank_record
from repros.runtime.bytecode import STORE_VARIABLE as BYTECODE_STORE_VARIABLE
from repros.runtime.lifeline import ORCHESTRATOR_VARIABLE, kill_descendants, orchestrator_marker
from repros.runtime.record import rank_record_path

#: This orchestrator, as its items' processes know it (``pid:start``).
ORCHESTRATOR = orchestrator_marker()

#: The directory that holds the worker package (``repros``) of this harness.
WORKER_PACKAGE_DIR = Path(repros.__file__).resolve().parent


def worker_root() -> Path:
    """A directory that holds the worker package and nothing else: the ranks' import path.

    The ``repros`` package may live beside the orchestrator's code and packages (in a
    checkout, or an installed harness's site-packages); a cell's interpreter must import
    every third-party package from its own environment, so it is given only a directory
    with a link to ``repros`` in it.
    """
    digest = hashlib.sha256(str(WORKER_PACKAGE_DIR).encode()).hexdigest()[:16]
    root = Path(tempfile.gettempdir()) / f"ft-regress-{os.getuid()}" / "worker-roots" / digest
    link = root / "repros"
    if link.is_symlink() and Path(os.readlink(link)) == WORKER_PACKAGE_DIR:
        return root
    root.mkdir(parents=True, exist_ok=True)
    staging = root / f".repros.{os.getpid()}.{threading.get_ident()}"
    staging.unlink(missing_ok=True)
    staging.symlink_to(WORKER_PACKAGE_DIR, target_is_directory=True)
    os.replace(staging, link)  # atomic: concurrent runs never see a missing link
    return root


def rank_environment(env: Environment, world_size: int, token: str = "") -> dict[str, str]:
    """The environment every process of an item starts with."""
    base = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH"}}
    # An interpreter the caller set up keeps the caller's import path (its provider says).
    pythonpath = [str(worker_root()), *provider_class(env.provider).rank_import_path(env)]
    base.update(
        PYTHONPATH=os.pathsep.join(pythonpath),
        PYTHONUNBUFFERED="1",
        PYTHONNOUSERSITE="1",
        # DeepSpeed's CPU accelerator calls numactl unless it knows the local size.
        LOCAL_SIZE=str(world_size),
        TORCH_EXTENSIONS_DIR=env.extensions_dir,
        # The scheduler gives each rank one core: one OpenMP thread each, whatever the caller had.
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HUB_DISABLE_TELEMETRY="1",
    )
    if env.bytecode_store:
        # What the ranks' imports compile is kept for the environment (``repros/runtime/bytecode.py``).
        base[BYTECODE_STORE_VARIABLE] = env.bytecode_store
    else:
        base.pop(BYTECODE_STORE_VARIABLE, None)
    # Which orchestrator the item's processes belong to: a later run stops what a killed one left.
    base[ORCHESTRATOR_VARIABLE] = ORCHESTRATOR
    if token:
        base[TOKEN_VARIABLE] = token
    return base


def with_lifeline(
    command: list[str], python: str, cgroup: ItemCgroup | None = None, report: Path | None = None
) -> list[str]:
    """``command``, run in the item's cgroup under a lifeline that reaps what it leaves and kills
    it all when this process ends; ``report``: where the lifeline lists what it killed."""
    options = ["--parent", str(os.getpid())] + (["--cgroup", str(cgroup.path)] if cgroup else [])
    options += ["--report", str(report)] if report else []
    return [python, "-m", "repros.runtime.lifeline", *options, "--", *command]


def read_reported_pids(path: Path) -> list[int]:
    """The pids a lifeline reported killing (and the report removed)."""
    try:
        text = path.read_text()
    except OSError:
        return []
    path.unlink(missing_ok=True)
    return [int(line) for line in text.split() if line.isdigit()]


def item_cgroup(token: str) -> ItemCgroup | None:
    """A cgroup of its own for the item, where the machine offers them."""
    return ItemCgroup.create(ORCHESTRATOR, token)


def end_item_cgroup(group: ItemCgroup | None) -> list[int]:
    """Kill whatever is still in the item's cgroup (daemons included), then remove it."""
    if group is None:
        return []
    killed = group.kill_all()
    group.remove()
    return killed


def signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def hung_ranks(item_dir: Path, world_size: int) -> dict[int, str]:
    """What each rank that has not ended was doing, as its record says now: the phase it had
    entered (``run``...), or, for a rank whose record is final but whose process lives on, that it
    hung after it (``teardown``); a rank with no record yet had not finished starting."""
    hung: dict[int, str] = {}
    for rank in range(world_size):
        record = read_rank_record(rank_record_path(item_dir, rank))
        if record is None:
            hung[rank] = "start (no record yet)"
        elif record.status == "running":
            phase = record.phase or "an unknown phase"
            hung[rank] = phase if not record.pid or _alive(record.pid) else f"{phase} (gone without a final record)"
        elif record.pid and _alive(record.pid):
            after = f"{record.phase} (after its {record.status} record)"
            hung[rank] = "teardown" if record.phase == "teardown" else after
    return hung


def ask_for_stacks(item_dir: Path, world_size: int) -> None:
    for rank in range(world_size):
        record = read_rank_record(rank_record_path(item_dir, rank))
        if record and record.pid and (record.status == "running" or _alive(record.pid)):
            try:
                os.kill(record.pid, signal.SIGUSR1)
            except (ProcessLookupError, PermissionError):
                pass


def end_item_tree(leader: int) -> list[int]:
    """Kill every descendant of the item's first process (its subreaper), then its process group;
    return the descendants killed."""
    killed = kill_descendants(leader)
    signal_group(leader, signal.SIGKILL)
    return killed


def stop_timed_out_item(
    item_dir: Path, world_size: int, pgid: int, ends_within: Callable[[float], bool]
) -> dict[int, str]:
    """The item's time is up: what each rank was doing is read from its record (returned: rank,
    phase), each rank prints its Python stacks into its log, then the item's process group is
    asked to end (SIGTERM) and, if it has not within 5 s, its processes are killed, the item's
    first process last."""
    hung = hung_ranks(item_dir, world_size)
    ask_for_stacks(item_dir, world_size)
    time.sleep(1.0)
    signal_group(pgid, signal.SIGTERM)
    if not ends_within(5.0):
        end_item_tree(pgid)
    return hung


#: Process groups of the items running now (several under ``--jobs``): an interrupt kills them all.
_in_flight: set[int] = set()
_in_flight_lock = threading.Lock()


def track_in_flight(pgid: int) -> None:
    with _in_flight_lock:
        _in_flight.add(pgid)


def untrack_in_flight(pgid: int) -> None:
    with _in_flight_lock:
        _in_flight.discard(pgid)


def groups_in_flight() -> list[int]:
    """The process groups of the items this process has started and not yet ended."""
    with _in_flight_lock:
        return sorted(_in_flight)


def kill_in_flight() -> list[int]:
    """SIGKILL every item running now: each one's descendants, then its process group (its first
    process, the subreaper, last); return the groups stopped (descendants or group signalled)."""
    with _in_flight_lock:
        groups = sorted(_in_flight)
    signalled = []
    for pgid in groups:
        # A leader whose processes were all killed may exit before its group is signalled: the
        # group was still stopped by this call.
        killed = kill_descendants(pgid)
        if signal_group(pgid, signal.SIGKILL) or killed:
            signalled.append(pgid)
    return signalled


IN_USE_FILE = ".harness-in-use"


@contextmanager
def extensions_in_use(extensions_dir: Path) -> Iterator[list[str]]:
    """Hold the environment's JIT directory for one launch; clear stale build locks.

    torch's JIT build takes a ``lock`` file beside the op it builds and waits, with no
    limit, for one that exists. A rank killed mid-build (a timeout, an interrupt)
    leaves that file behind and every later item in the environment waits forever.
    Each launch holds a shared flock on the directory; one that can take it
    exclusively knows no other launch is using the directory, so any build lock there
    is stale and is removed (and yielded, for the record).
    """
    extensions_dir.mkdir(parents=True, exist_ok=True)
    removed: list[str] = []
    with open(extensions_dir / IN_USE_FILE, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pass  # another launch is using the directory: its locks may be live
        else:
            for baton in sorted(extensions_dir.glob("*/lock")):
                baton.unlink(missing_ok=True)
                removed.append(str(baton))
        fcntl.flock(handle, fcntl.LOCK_SH)
        try:
            yield removed
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
