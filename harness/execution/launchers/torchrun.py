"""Launch one item's ranks with torchrun in a cell's interpreter, and collect them.

torchrun runs in a new session (its own process group) with ``--standalone``, which
binds its rendezvous to a free port chosen by the OS, so concurrent items never
collide on a port. torchrun runs under a lifeline (``repros/runtime/lifeline.py``): in the
item's cgroup where there is one, and the item's subreaper, so that whatever the ranks leave
(a daemon in a session of its own) stays its descendant. When the item's time is up, each
rank is asked for its Python stacks (SIGUSR1, answered by faulthandler into its log), then
torchrun's process group is terminated (torchrun stops its ranks) and, where it does not end,
the lifeline's descendants are killed, then the lifeline. After every launch, however it
ended, what is left in the cgroup and every process that carries the item's token variable
is killed too: nothing the item started outlives it. torchrun's output and each rank's log
come through pipes the orchestrator copies into the item's logs, capped (``logs.py``).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.core.json import JsonObject
from harness.environments import Environment
from harness.execution.containment.leftovers import in_flight_item
from harness.execution.containment.processes import sweep
from harness.execution.launchers.base import LauncherContext, LaunchRequest
from harness.execution.launchers.diagnose import identity
from harness.execution.launchers.logs import LogPump
from harness.execution.launchers.result import TAIL_BYTES, LaunchResult, collect_item, tail
from harness.execution.launchers.supervision import (
    end_item_cgroup,
    end_item_tree,
    extensions_in_use,
    item_cgroup,
    rank_environment,
    read_reported_pids,
    stop_timed_out_item,
    track_in_flight,
    untrack_in_flight,
    with_lifeline,
    worker_root,
)
from repros.runtime.record import rank_log_path

#: Where the item's lifeline lists what the item left running and it killed.
LIFELINE_REPORT = ".lifeline-killed"

_FAILURE_ENTRY = re.compile(r"rank\s*:\s*(?P<rank>\d+)[^\n]*\n\s*exitcode\s*:\s*(?P<code>-?\d+)")


def torchrun_command(
    python: str, module: str, mode: str, world_size: int, item_dir: Path, params: Mapping[str, Any] | None = None
) -> list[str]:
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
        "repros.runtime.rank_main",
        "--module",
        module,
        "--mode",
        mode,
        "--item-dir",
        str(item_dir),
        "--params",
        json.dumps(dict(params or {}), sort_keys=True),
    ]


def torchrun_exitcodes(item_dir: Path) -> dict[int, int]:
    """The exit codes torchrun reported in its log for the ranks that failed."""
    launcher_tail = tail(item_dir / "launcher.log", 3 * TAIL_BYTES)
    return {int(m["rank"]): int(m["code"]) for m in _FAILURE_ENTRY.finditer(launcher_tail)}


def _exits_within(proc: subprocess.Popen[bytes], limit_s: float) -> bool:
    try:
        proc.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        return False
    return True


def launch_item(request: LaunchRequest) -> LaunchResult:
    """One item under ``torchrun --standalone``, supervised, its logs capped, and swept."""
    item_dir = request.item_dir
    env: Environment = request.env
    item_dir.mkdir(parents=True, exist_ok=True)
    command = torchrun_command(env.python, request.module, request.mode, request.world_size, item_dir, request.params)
    token = secrets.token_hex(8)
    group = item_cgroup(token)
    launched_at = time.time()
    started = time.perf_counter()
    timed_out = False
    hung: dict[int, str] = {}
    dir_before = identity(item_dir)
    report = item_dir / LIFELINE_REPORT
    pump = LogPump()
    for rank in range(request.world_size):
        pump.listen(rank_log_path(item_dir, rank))
    launcher_out = pump.attach(item_dir / "launcher.log")
    with extensions_in_use(Path(env.extensions_dir)) as stale_locks, in_flight_item(token, item_dir):
        try:
            proc = subprocess.Popen(
                with_lifeline(command, env.python, group, report),
                cwd=worker_root(),
                env={**rank_environment(env, request.world_size, token), **request.extra_env},
                stdin=subprocess.DEVNULL,
                stdout=launcher_out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            os.close(launcher_out)
        pump.start()
        pgid = proc.pid
        track_in_flight(pgid)
        leftovers: list[int] = []
        try:
            if not _exits_within(proc, request.timeout_s):
                timed_out = True
                hung = stop_timed_out_item(item_dir, request.world_size, pgid, lambda limit: _exits_within(proc, limit))
        finally:
            # The lifeline is the item's subreaper: its descendants go first, then its group.
            leftovers += end_item_tree(pgid)
            untrack_in_flight(pgid)
            proc.wait()
            # Whatever is left in the item's cgroup, then whatever carries the token, goes.
            leftovers += read_reported_pids(report) + end_item_cgroup(group) + sweep(token)
            pump.finish()
        # Still noted as in flight: a run killed before its /dev/shm segments go leaves them to the next.
        return collect_item(
            command,
            item_dir,
            request.world_size,
            proc.returncode,
            timed_out,
            time.perf_counter() - started,
            leftovers,
            rank_exitcodes=torchrun_exitcodes(item_dir),
            stale_locks=stale_locks,
            logs=list(pump.logs.values()),
            dir_before=dir_before,
            scan_root=request.scan_root,
            hung=hung,
            launched_at=launched_at,
        )


class TorchrunLauncher:
    """A bare ``torchrun`` per item: every rank imports its stack anew (slow, simple, standard)."""

    name = "torchrun"

    def __init__(self, context: LauncherContext | None = None) -> None:
        self.context = context

    def launch(self, request: LaunchRequest) -> LaunchResult:
        return launch_item(request)

    def cell_done(self, env: Environment) -> None:
        pass

    def describe(self) -> JsonObject:
        return {}

    def abort(self) -> None:
        pass

    def close(self) -> None:
        pass
