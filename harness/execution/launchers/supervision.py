"""What every launcher does around an item, whatever starts its ranks.

* The ranks' environment: the cell's interpreter sees the worker package (``repros``) and
  nothing else of the orchestrator's (``worker_root``), one OpenMP thread a rank (the
  scheduler counts one core a rank), offline hubs, and DeepSpeed told the local size.
* The item's process group is tracked while it runs, so an interrupt kills every item in
  flight (``kill_in_flight``).
* The environment's JIT directory is held while an item uses it; a build lock left by a
  killed build is cleared when nobody else uses the directory (``extensions_in_use``).
* On timeout each rank is asked for its Python stacks, then the group is terminated and
  killed (``stop_timed_out_item``).
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
from repros.runtime.lifeline import ORCHESTRATOR_VARIABLE, orchestrator_marker
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
    # Which orchestrator the item's processes belong to: a later run stops what a killed one left.
    base[ORCHESTRATOR_VARIABLE] = ORCHESTRATOR
    if token:
        base[TOKEN_VARIABLE] = token
    return base


def with_lifeline(command: list[str], python: str, cgroup: ItemCgroup | None = None) -> list[str]:
    """``command``, run in the item's cgroup so that it is killed when this process ends."""
    options = ["--parent", str(os.getpid())] + (["--cgroup", str(cgroup.path)] if cgroup else [])
    return [python, "-m", "repros.runtime.lifeline", *options, "--", *command]


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


def ask_for_stacks(item_dir: Path, world_size: int) -> None:
    for rank in range(world_size):
        record = read_rank_record(rank_record_path(item_dir, rank))
        if record and record.status == "running" and record.pid:
            try:
                os.kill(record.pid, signal.SIGUSR1)
            except (ProcessLookupError, PermissionError):
                pass


def stop_timed_out_item(item_dir: Path, world_size: int, pgid: int, ends_within: Callable[[float], bool]) -> None:
    """The item's time is up: each rank prints its Python stacks into its log, then the
    item's process group is asked to end (SIGTERM) and, if it has not within 5 s, killed."""
    ask_for_stacks(item_dir, world_size)
    time.sleep(1.0)
    signal_group(pgid, signal.SIGTERM)
    if not ends_within(5.0):
        signal_group(pgid, signal.SIGKILL)


#: Process groups of the items running now (several under ``--jobs``): an interrupt kills them all.
_in_flight: set[int] = set()
_in_flight_lock = threading.Lock()


def track_in_flight(pgid: int) -> None:
    with _in_flight_lock:
        _in_flight.add(pgid)


def untrack_in_flight(pgid: int) -> None:
    with _in_flight_lock:
        _in_flight.discard(pgid)


def kill_in_flight() -> list[int]:
    """SIGKILL the process group of every item running now; return the groups signalled."""
    with _in_flight_lock:
        groups = sorted(_in_flight)
    return [pgid for pgid in groups if signal_group(pgid, signal.SIGKILL)]


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
