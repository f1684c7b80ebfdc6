"""``--executor local`` (the default): items run on this machine, as many at once as ``--jobs``
and the machine's free cores, memory and GPUs allow (``scheduler.Slots``), their ranks started by
the run's launcher in environments the orchestrator made ready."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from harness.environments import Environments, Resolved
from harness.execution.launchers import LauncherContext, kill_in_flight, make_launcher
from harness.execution.scheduler import Demand, Machine, Slots
from harness.pipeline.executors.base import Attempted, ExecutorContext, ItemJob
from harness.pipeline.observe import observe_item
from harness.planning.items import PlannedItem
from harness.records.run_dir import RunDir


class LocalExecutor:
    name = "local"
    builds_environments = True

    def __init__(self, context: ExecutorContext, run_dir: RunDir, environments: Environments | None) -> None:
        self.context = context
        self.run_dir = run_dir
        self.launcher = make_launcher(context.launcher, LauncherContext(log_dir=run_dir.workers_dir))
        self.environments = environments
        self.machine = Machine.detect()
        self.slots = Slots(self.machine, context.jobs)
        #: Cells whose environment was made ready and whose items are not all done, by environment.
        self._queued: dict[str, int] = {}
        self._lock = threading.Lock()

    def in_flight(self) -> int:
        return max(1, self.context.jobs or self.machine.cpus)

    def submit_cell(self, jobs: Sequence[ItemJob]) -> None:
        pass

    def place(self, item: PlannedItem) -> AbstractContextManager[Sequence[str]]:
        return self._hold(item)

    @contextmanager
    def _hold(self, item: PlannedItem) -> Iterator[Sequence[str]]:
        with self.slots.hold(Demand.for_item(item.world_size, self.machine)) as gpus:
            yield gpus

    def attempt(self, job: ItemJob, resolved: Resolved | None, gpus: Sequence[str]) -> Attempted:
        assert resolved is not None, "the local executor runs items of cells whose environment was asked for"
        record = observe_item(
            run_id=job.run_id,
            item=job.item,
            repro=job.repro,
            resolved=resolved,
            run_dir=self.run_dir,
            launcher=self.launcher,
            repro_cmd=job.repro_cmd,
            gpus=gpus,
            environments=self.environments,
            known=job.known,
        )
        return Attempted(record)

    def prepare(self, resolved: Resolved, cell: str) -> None:
        """The cell's environment is ready and its items will come: the launcher may start what they
        need ahead (a pre-imported worker), where it can."""
        if resolved.env is None:
            return
        with self._lock:
            self._queued[resolved.env.key] = self._queued.get(resolved.env.key, 0) + 1
        prepare = getattr(self.launcher, "prepare", None)  # optional (``Launcher``)
        if prepare is not None:
            prepare(resolved.env, cell)

    def cell_done(self, resolved: Resolved | None) -> None:
        if resolved is None or resolved.env is None:
            return
        with self._lock:
            left = self._queued.get(resolved.env.key, 0) - 1
            if left > 0:
                self._queued[resolved.env.key] = left
                return  # another queued cell uses the same environment: what it keeps serves that one too
            self._queued.pop(resolved.env.key, None)
        self.launcher.cell_done(resolved.env)

    def abort(self) -> None:
        kill_in_flight()
        self.launcher.abort()

    def close(self) -> None:
        self.launcher.close()

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "machine": self.machine.describe(), "most_at_once": self.slots.peak}

    def workers(self) -> dict[str, Any]:
        """The launcher's work by cell, for ``run.json`` (a pre-imported worker's start...)."""
        return self.launcher.describe()
