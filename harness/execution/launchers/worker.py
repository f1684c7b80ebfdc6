"""The default launcher: each item's ranks forked from the cell's pre-imported worker.

A cell's worker (``cell_worker.py`` here, ``repros/runtime/cell_server.py`` in the cell) imports
torch, transformers, peft and deepspeed once; every item is a fresh fork of it. Where a
cell cannot have a worker (it does not start, or its imports left it unsafe to fork), its
items go to torchrun and each record says why (``launcher_fallback``).
"""

from __future__ import annotations

import dataclasses

from harness.core.json import JsonObject
from harness.environments import Environment
from harness.execution.launchers.base import LauncherContext, LaunchRequest
from harness.execution.launchers.cell_worker import WorkerGone, WorkerPool
from harness.execution.launchers.result import LaunchResult
from harness.execution.launchers.torchrun import launch_item

#: A worker that was closed or died before it forked the item is asked again this often.
ATTEMPTS = 3


class WorkerLauncher:
    name = "worker"

    def __init__(self, context: LauncherContext, server_args: tuple[str, ...] = ()) -> None:
        self.pool = WorkerPool(context.log_dir, server_args=server_args)

    def launch(self, request: LaunchRequest) -> LaunchResult:
        for _ in range(ATTEMPTS):
            worker = self.pool.get(request.env, request.cell or request.env.key)
            if worker is None:
                break
            try:
                return worker.launch(request)
            except WorkerGone:
                continue  # nothing of the item ran: the pool starts another worker
        result = launch_item(request)
        result.fallback_reason = self.pool.reason(request.env) or "the cell's worker went away before the item started"
        return result

    def prepare(self, env: Environment, cell: str) -> None:
        """The cell's items are queued: its worker starts ahead of the first (``WorkerPool.prepare``)."""
        self.pool.prepare(env, cell)

    def cell_done(self, env: Environment) -> None:
        self.pool.retire(env)

    def describe(self) -> JsonObject:
        cells: JsonObject = {name: dataclasses.asdict(info) for name, info in self.pool.started_by_cell().items()}
        for name, reason in self.pool.unavailable_by_cell().items():
            cells[name] = {"unavailable": reason}
        return cells

    def abort(self) -> None:
        self.pool.abort()

    def close(self) -> None:
        self.pool.close()
