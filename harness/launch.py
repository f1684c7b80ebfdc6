"""Launch one item's ranks with torchrun in a cell's interpreter, and collect them.

torchrun runs in a new session (its own process group) with ``--standalone``, which
binds its rendezvous to a free port chosen by the OS, so concurrent items never
collide on a port. When the item's time is up, each rank is asked for its Python
stacks (SIGUSR1, answered by faulthandler into its log), then torchrun's process group
is terminated (torchrun stops its ranks) and killed. torchrun puts each rank in a
session of its own, so after every launch, however it ended, every process that
carries the item's token variable is killed too: nothing the item started outlives it.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.environments import Environment
from harness.process_sweep import TOKEN_VARIABLE, sweep
from harness.shm_sweep import remove_item_segments
from repros.common.record import rank_log_path, rank_record_path

TAIL_BYTES = 4000
_FAILURE_ENTRY = re.compile(r"rank\s*:\s*(?P<rank>\d+)[^\n]*\n\s*exitcode\s*:\s*(?P<code>-?\d+)")


@dataclass
class LaunchResult:
    command: list[str]
    returncode: int | None
    timed_out: bool
    wall_s: float
    world_size: int
    #: Each rank's record, or None where the rank never wrote one.
    records: dict[int, dict[str, Any] | None]
    #: Exit codes torchrun reported for failed ranks (negative: killed by that signal).
    rank_exitcodes: dict[int, int] = field(default_factory=dict)
    rank_tails: dict[int, str] = field(default_factory=dict)
    launcher_tail: str = ""
    #: Processes of the item still alive after torchrun ended, killed by the sweep.
    leftovers_killed: list[int] = field(default_factory=list)
    #: Build locks a killed JIT build had left in the environment's extensions dir.
    stale_build_locks_removed: list[str] = field(default_factory=list)
    #: DeepSpeed's shared-memory segments the item left in /dev/shm, removed after it.
    shm_segments_removed: list[str] = field(default_factory=list)
    #: How the ranks were started: "torchrun", or "worker" (forked by the cell's pre-imported worker).
    launcher: str = "torchrun"


def tail(path: Path, limit: int = TAIL_BYTES) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - limit))
            data = fh.read()
    except FileNotFoundError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return text if size <= limit else "…" + text


def rank_environment(env: Environment, world_size: int, repo_root: Path, token: str = "") -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONHOME"}}
    pythonpath = [str(repo_root)] + ([base["PYTHONPATH"]] if base.get("PYTHONPATH") else [])
    base.update(
        PYTHONPATH=os.pathsep.join(pythonpath),
        PYTHONUNBUFFERED="1",
        # DeepSpeed's CPU accelerator calls numactl unless it knows the local size.
        LOCAL_SIZE=str(world_size),
        TORCH_EXTENSIONS_DIR=env.extensions_dir,
        OMP_NUM_THREADS=base.get("OMP_NUM_THREADS", "1"),
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HUB_DISABLE_TELEMETRY="1",
    )
    if token:
        base[TOKEN_VARIABLE] = token
    return base


def torchrun_command(python: str, module: str, mode: str, world_size: int, item_dir: Path) -> list[str]:
    return [
        python,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes",
        "1",
        "--nproc_per_node",
        str(world_size),
        "--max_restarts",
        "0",
        "-m",
        "repros.common.rank_main",
        "--module",
        module,
        "--mode",
        mode,
        "--item-dir",
        str(item_dir),
    ]


def read_record(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def ask_for_stacks(item_dir: Path, world_size: int) -> None:
    for rank in range(world_size):
        record = read_record(rank_record_path(item_dir, rank))
        if record and record.get("status") == "running" and record.get("pid"):
            try:
                os.kill(int(record["pid"]), signal.SIGUSR1)
            except (ProcessLookupError, PermissionError):
                pass


IN_USE_FILE = ".harness-in-use"

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


def launch_item(
    env: Environment,
    module: str,
    mode: str,
    world_size: int,
    item_dir: Path,
    timeout_s: float,
    repo_root: Path,
    extra_env: dict[str, str] | None = None,
) -> LaunchResult:
    item_dir.mkdir(parents=True, exist_ok=True)
    command = torchrun_command(env.python, module, mode, world_size, item_dir)
    launcher_log = item_dir / "launcher.log"
    token = secrets.token_hex(8)
    started = time.perf_counter()
    timed_out = False
    with extensions_in_use(Path(env.extensions_dir)) as stale_locks, open(launcher_log, "wb") as log:
        proc = subprocess.Popen(
            command,
            cwd=repo_root,
            env={**rank_environment(env, world_size, repo_root, token), **(extra_env or {})},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        pgid = proc.pid
        track_in_flight(pgid)
        try:
            if not _exits_within(proc, timeout_s):
                timed_out = True
                stop_timed_out_item(item_dir, world_size, pgid, lambda limit: _exits_within(proc, limit))
        finally:
            signal_group(pgid, signal.SIGKILL)
            untrack_in_flight(pgid)
            proc.wait()
            # The ranks live in sessions of their own: sweep whatever carries the token.
            leftovers = sweep(token)
    wall_s = time.perf_counter() - started
    return collect_item(
        command,
        item_dir,
        world_size,
        proc.returncode,
        timed_out,
        wall_s,
        leftovers,
        rank_exitcodes=torchrun_exitcodes(item_dir),
        stale_locks=stale_locks,
    )


def _exits_within(proc: subprocess.Popen[bytes], limit_s: float) -> bool:
    try:
        proc.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        return False
    return True


def stop_timed_out_item(item_dir: Path, world_size: int, pgid: int, ends_within: Callable[[float], bool]) -> None:
    """The item's time is up: each rank prints its Python stacks into its log, then the
    item's process group is asked to end (SIGTERM) and, if it has not within 5 s, killed."""
    ask_for_stacks(item_dir, world_size)
    time.sleep(1.0)
    signal_group(pgid, signal.SIGTERM)
    if not ends_within(5.0):
        signal_group(pgid, signal.SIGKILL)


def torchrun_exitcodes(item_dir: Path) -> dict[int, int]:
    """The exit codes torchrun reported in its log for the ranks that failed."""
    launcher_tail = tail(item_dir / "launcher.log", 3 * TAIL_BYTES)
    return {int(m["rank"]): int(m["code"]) for m in _FAILURE_ENTRY.finditer(launcher_tail)}


def collect_item(
    command: list[str],
    item_dir: Path,
    world_size: int,
    returncode: int | None,
    timed_out: bool,
    wall_s: float,
    leftovers: list[int],
    *,
    rank_exitcodes: dict[int, int],
    stale_locks: Sequence[str] = (),
    launcher: str = "torchrun",
) -> LaunchResult:
    """Read back what a finished launch left in ``item_dir``, once every process of it is
    gone, and remove what DeepSpeed left of it in /dev/shm (memory)."""
    records = {r: read_record(rank_record_path(item_dir, r)) for r in range(world_size)}
    shm_removed = remove_item_segments(records.values())
    return LaunchResult(
        command=command,
        returncode=None if timed_out else returncode,
        timed_out=timed_out,
        wall_s=wall_s,
        world_size=world_size,
        records=records,
        rank_exitcodes=rank_exitcodes,
        rank_tails={r: tail(rank_log_path(item_dir, r)) for r in range(world_size)},
        launcher_tail=tail(item_dir / "launcher.log"),
        leftovers_killed=sorted(set(leftovers)),
        stale_build_locks_removed=list(stale_locks),
        shm_segments_removed=shm_removed,
        launcher=launcher,
    )
