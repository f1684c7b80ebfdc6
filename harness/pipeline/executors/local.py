"""``--executor local`` (the default): items run on this machine, as many at once as ``--jobs``
and the machine's free cores, memory and GPUs allow (``scheduler.Slots``), their ranks started by
the run's launcher in environments the orchestrator made ready. An item's GPUs are leased across
processes too (``gpu_lease``): two runs, or two pytest-xdist workers, never share one.

Its ``attempt`` is the one place an attempt is observed (``observe_item``); a cluster's node runs
it too (``node.py``), with the node's own launcher and environments."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from functools import cached_property

from harness.core.json import JsonObject
from harness.core.option import Option
from harness.environments import Resolved
from harness.execution.gpu_lease import lease
from harness.execution.launchers import Launcher, LauncherContext, kill_in_flight, make_launcher
from harness.execution.scheduler import Demand, Machine, Slots
from harness.pipeline.executors.base import Attempted, ExecutorContext, ItemJob
from harness.pipeline.observe import observe_item
from harness.planning.items import PlannedItem
from harness.planning.run_options import ExecutorChoice


class LocalExecutor:
    name = "local"
    builds_environments = True
    needs: tuple[str, str] | None = None
    options: tuple[Option, ...] = ()

    @classmethod
    def check(cls, choice: ExecutorChoice) -> None:
        """Nothing to check before a run: this machine is here."""

    def __init__(self, context: ExecutorContext, launcher: Launcher | None = None) -> None:
        self.context = context
        self.run_dir = context.run_dir
        self.launcher = launcher or make_launcher(
            context.choice.launcher, LauncherContext(log_dir=context.log_dir or context.run_dir.workers_dir)
        )
        self.environments = context.environments
        #: Cells whose environment was made ready and whose items are not all done, by environment.
        self._queued: dict[str, int] = {}
        self._lock = threading.Lock()

    @cached_property
    def machine(self) -> Machine:
        return Machine.detect()

    @cached_property
    def slots(self) -> Slots:
        return Slots(self.machine, self.context.choice.jobs)

    def in_flight(self) -> int:
        return max(1, self.context.choice.jobs or self.machine.cpus)

    def submit_cell(self, jobs: Sequence[ItemJob]) -> None:
        pass

    def place(self, item: PlannedItem) -> AbstractContextManager[Sequence[str]]:
        return self._hold(item)

    @contextmanager
    def _hold(self, item: PlannedItem) -> Iterator[Sequence[str]]:
        with (
            self.slots.hold(Demand.for_item(item.world_size, self.machine)) as counted,
            lease(len(counted), self.machine.gpus) as gpus,
        ):
            yield gpus

    def attempt(self, job: ItemJob, resolved: Resolved | None, gpus: Sequence[str]) -> Attempted:
        assert resolved is not None, "the local executor runs items of cells whose environment was asked for"
        return Attempted(observe_item(job, resolved, self.run_dir, self.launcher, gpus, self.environments))

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

    def describe(self) -> JsonObject:
        return {"name": self.name, "machine": self.machine.describe(), "most_at_once": self.slots.peak}

    def workers(self) -> JsonObject:
        """The launcher's work by cell, for ``run.json`` (a pre-imported worker's start...)."""
        return self.launcher.describe()
