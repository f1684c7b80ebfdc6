"""Run planned items on threads, as many at once as ``--jobs`` and the machine's free cores,
memory and GPUs allow (``scheduler.Slots``); record each on the main thread as it finishes.
A cell's launcher resources (its pre-imported worker) are released once its last item is done."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from harness.config.repros import Repro
from harness.environments import Environment, Environments, Resolved
from harness.execution.launchers import Launcher, kill_in_flight
from harness.execution.scheduler import Demand, Machine, Slots
from harness.pipeline import attempts as reruns
from harness.pipeline.observe import observe_item
from harness.planning.commands import repro_command
from harness.planning.items import PlannedItem, RunOptions
from harness.records.item import Attempt, ItemRecord
from harness.records.run_dir import RunDir
from repros.runtime.outcomes import Outcome


@dataclass
class ItemPolicy:
    """What a command adds around its items (``grid``): the repro an item runs, where it is not a
    discovered repro; the expectation of a record, where it is not the repro's; and the items a
    finished one asks for next (a known failure run again through the guards)."""

    repro_for: Callable[[PlannedItem], Repro] | None = None
    annotate: Callable[[ItemRecord], ItemRecord] | None = None
    follow_ups: Callable[[PlannedItem, ItemRecord], list[PlannedItem]] | None = None


class Dispatch:
    def __init__(
        self,
        opts: RunOptions,
        run_id: str,
        run_dir: RunDir,
        launcher: Launcher,
        on_record: Callable[[ItemRecord], None],
        on_progress: Callable[[int], None] = lambda running: None,
        environments: Environments | None = None,
        policy: ItemPolicy | None = None,
    ) -> None:
        self.policy = policy or ItemPolicy()
        self.futures: dict[Future[ItemRecord | None], tuple[PlannedItem, Resolved]] = {}
        self.environments = environments
        self.known = [r.spec for r in opts.discovery.repros.values()]
        self.opts = opts
        self.run_id = run_id
        self.run_dir = run_dir
        self.launcher = launcher
        self.on_record = on_record
        self.on_progress = on_progress
        self.machine = Machine.detect()
        self.slots = Slots(self.machine, opts.jobs)
        self.stop = threading.Event()
        self.pending: set[Future[ItemRecord | None]] = set()
        self.left_in_cell: dict[str, int] = {}
        self.env_of_cell: dict[str, Environment] = {}
        threads = opts.jobs or self.machine.cpus
        self.executor = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="item")

    def submit(self, items: list[PlannedItem], resolved: Resolved, collect: bool = True) -> None:
        for item in items:
            self.left_in_cell[item.cell.name] = self.left_in_cell.get(item.cell.name, 0) + 1
            if resolved.env is not None:
                self.env_of_cell[item.cell.name] = resolved.env
            future = self.executor.submit(self._observe, item, resolved)
            self.futures[future] = (item, resolved)
            self.pending.add(future)
        if collect:
            self.collect(block=False)

    def _observe(self, item: PlannedItem, resolved: Resolved) -> ItemRecord | None:
        """The item's record; with ``--repeat``, over every attempt; with ``--reruns``, after running it
        again while it contradicts its expectation (``harness/pipeline/attempts.py``), every attempt kept."""
        earlier: list[Attempt] = []
        item_dir = self.run_dir.item_dir(item.id)
        with self.slots.hold(Demand.for_item(item.world_size, self.machine)) as gpus:
            while True:
                if self.stop.is_set():
                    return None
                record = self._observe_once(item, resolved, gpus)
                if self.opts.repeat > 1 and record.outcome != Outcome.UNRESOLVABLE:
                    if len(earlier) + 1 >= self.opts.repeat:
                        return reruns.repeated(record, earlier, item_dir if item_dir.exists() else None)
                    kept = reruns.set_aside(item_dir, len(earlier) + 1)
                    earlier.append(reruns.attempt_summary(record, kept))
                    continue
                if len(earlier) >= self.opts.reruns or not reruns.contradicts_expectation(record):
                    return reruns.with_attempts(record, earlier)
                kept = reruns.set_aside(item_dir, len(earlier) + 1)
                earlier.append(reruns.attempt_summary(record, kept))

    def _observe_once(self, item: PlannedItem, resolved: Resolved, gpus: list[str]) -> ItemRecord:
        return observe_item(
            run_id=self.run_id,
            item=item,
            repro=self.policy.repro_for(item) if self.policy.repro_for else self.opts.discovery.repros[item.repro_id],
            resolved=resolved,
            run_dir=self.run_dir,
            launcher=self.launcher,
            repro_cmd=repro_command(self.opts, item),
            gpus=gpus,
            environments=self.environments,
            known=self.known,
        )

    def collect(self, block: bool) -> None:
        done, _ = wait(self.pending, timeout=0.2 if block else 0, return_when=FIRST_COMPLETED)
        for future in done:
            self.pending.discard(future)
            item, resolved = self.futures.pop(future)
            record = future.result()
            if record is None or self.stop.is_set():
                continue
            if self.policy.annotate:
                record = self.policy.annotate(record)
            self.on_record(record)
            if self.policy.follow_ups:
                # Submitted before this item is counted done, so the cell's worker is kept for them.
                for follow_up in self.policy.follow_ups(item, record):
                    self.submit([follow_up], resolved, collect=False)
            cell = record.cell
            self.left_in_cell[cell] -= 1
            if self.left_in_cell[cell] == 0 and cell in self.env_of_cell:
                self.launcher.cell_done(self.env_of_cell[cell])
        self.on_progress(len(self.pending))

    def drain(self) -> None:
        while self.pending:
            self.collect(block=True)

    def abort(self) -> None:
        """Stop: no new item starts, the running ones are killed, their records dropped."""
        self.stop.set()
        kill_in_flight()
        self.launcher.abort()
        self.executor.shutdown(wait=True, cancel_futures=True)
        kill_in_flight()

    def concurrency(self) -> dict[str, Any]:
        return {"jobs": self.opts.jobs, "machine": self.machine.describe(), "most_at_once": self.slots.peak}
