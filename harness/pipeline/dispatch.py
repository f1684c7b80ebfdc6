"""Run planned items through the run's executor (``harness/pipeline/executors``), as many at once
as it takes, and record each on the main thread as it finishes. An item's attempts (``--repeat``,
``--reruns``, and a run again after its node was lost) are decided here, whatever the executor.
A cell's launcher resources (its pre-imported worker) are released once its last item is done."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from harness.config.repros import Repro
from harness.environments import Resolved
from harness.pipeline import attempts as reruns
from harness.pipeline.executors import Attempted, Executor, ItemJob
from harness.pipeline.executors.lost import attempt_until_not_lost
from harness.planning.commands import repro_command
from harness.planning.items import PlannedItem, RunOptions
from harness.records.item import Attempt, ItemRecord
from harness.records.run_dir import RunDir
from harness.records.run_meta import CellMeta
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
        executor: Executor,
        on_record: Callable[[ItemRecord], None],
        on_progress: Callable[[int], None] = lambda running: None,
        policy: ItemPolicy | None = None,
        on_cell: Callable[[str, CellMeta], None] = lambda cell, meta: None,
    ) -> None:
        self.policy = policy or ItemPolicy()
        self.futures: dict[Future[ItemRecord | None], tuple[PlannedItem, Resolved | None]] = {}
        self.known = [r.spec for r in opts.discovery.repros.values()]
        self.opts = opts
        self.run_id = run_id
        self.run_dir = run_dir
        self.executor = executor
        self.on_record = on_record
        self.on_progress = on_progress
        #: A remote executor's node says how it found a cell's environment: said once per cell.
        self.on_cell = on_cell
        self.cells_seen: set[str] = set()
        self.stop = threading.Event()
        self.pending: set[Future[ItemRecord | None]] = set()
        self.left_in_cell: dict[str, int] = {}
        self.resolved_of_cell: dict[str, Resolved | None] = {}
        self._cell_meta: dict[str, CellMeta] = {}
        #: Items with finished attempts and no record yet: each attempt's directory.
        self._unrecorded: dict[str, list[str]] = {}
        self._lock = threading.Lock()
        self.threads = ThreadPoolExecutor(max_workers=executor.in_flight(), thread_name_prefix="item")

    def submit(self, items: list[PlannedItem], resolved: Resolved | None, collect: bool = True) -> None:
        jobs = [self._job(item) for item in items]
        # A cluster executor may hand a cell's items to its scheduler at once (a Slurm job array).
        self.executor.submit_cell(jobs)
        for job in jobs:
            item = job.item
            self.left_in_cell[item.cell.name] = self.left_in_cell.get(item.cell.name, 0) + 1
            self.resolved_of_cell[item.cell.name] = resolved
            future = self.threads.submit(self._observe, job, resolved)
            self.futures[future] = (item, resolved)
            self.pending.add(future)
        if collect:
            self.collect(block=False)

    def _job(self, item: PlannedItem) -> ItemJob:
        return ItemJob(
            run_id=self.run_id,
            item=item,
            repro=self.policy.repro_for(item) if self.policy.repro_for else self.opts.discovery.repros[item.repro_id],
            repro_cmd=repro_command(self.opts, item),
            known=self.known,
        )

    def _observe(self, job: ItemJob, resolved: Resolved | None) -> ItemRecord | None:
        """The item's record; with ``--repeat``, over every attempt; with ``--reruns``, after running it
        again while it contradicts its expectation (``harness/pipeline/attempts.py``), every attempt kept;
        after a lost node, run again (``executors/lost.py``)."""
        item = job.item
        item_dir = self.run_dir.item_dir(item.id)
        # The attempts an interrupted run finished of this item (``--resume``) count: it goes on
        # from them. What else that run left of it (the attempt it cut short) is removed.
        earlier = reruns.recover(item_dir)
        self._kept(item, earlier)
        with self.executor.place(item) as gpus:
            while True:
                if self.stop.is_set():
                    return None
                record = self._seen(attempt_until_not_lost(self.executor, job, resolved, gpus))
                if self.stop.is_set():
                    return None  # cut short by the stop: not an attempt that finished
                if self.opts.repeat > 1 and record.outcome != Outcome.UNRESOLVABLE:
                    if len(earlier) + 1 >= self.opts.repeat:
                        return reruns.repeated(record, earlier, item_dir if item_dir.exists() else None)
                    earlier.append(reruns.attempt_summary(record, reruns.set_aside(item_dir, len(earlier) + 1, record)))
                    self._kept(item, earlier)
                    continue
                if len(earlier) >= self.opts.reruns or not reruns.contradicts_expectation(record):
                    return reruns.with_attempts(record, earlier)
                earlier.append(reruns.attempt_summary(record, reruns.set_aside(item_dir, len(earlier) + 1, record)))
                self._kept(item, earlier)

    def _kept(self, item: PlannedItem, earlier: list[Attempt]) -> None:
        """Note the attempts of an item not recorded yet, each kept with its own record beside the
        item (``run.json`` names them where the run stops before the item's record is written)."""
        with self._lock:
            if earlier:
                self._unrecorded[item.id.label()] = [str(a.item_dir) for a in earlier]

    def unrecorded_attempts(self) -> dict[str, list[str]]:
        """The finished attempts of items with no record yet, by item: each attempt's directory,
        holding its record (``attempt.json``). Empty once every item started is recorded."""
        with self._lock:
            return {label: list(dirs) for label, dirs in self._unrecorded.items()}

    def _seen(self, attempted: Attempted) -> ItemRecord:
        record = attempted.record
        if attempted.cell_meta is not None:
            with self._lock:
                self._cell_meta.setdefault(record.cell, attempted.cell_meta)
        return record

    def collect(self, block: bool) -> None:
        done, _ = wait(self.pending, timeout=0.2 if block else 0, return_when=FIRST_COMPLETED)
        with self._lock:
            said = {c: m for c, m in self._cell_meta.items() if c not in self.cells_seen}
            self.cells_seen.update(said)
        for cell, meta in said.items():
            self.on_cell(cell, meta)
        for future in done:
            self.pending.discard(future)
            item, resolved = self.futures.pop(future)
            record = future.result()
            if record is None or self.stop.is_set():
                continue
            if self.policy.annotate:
                record = self.policy.annotate(record)
            self.on_record(record)
            with self._lock:
                self._unrecorded.pop(item.id.label(), None)
            if self.policy.follow_ups:
                # Submitted before this item is counted done, so the cell's worker is kept for them.
                for follow_up in self.policy.follow_ups(item, record):
                    self.submit([follow_up], resolved, collect=False)
            cell = record.cell
            self.left_in_cell[cell] -= 1
            if self.left_in_cell[cell] == 0:
                self.executor.cell_done(self.resolved_of_cell.get(cell))
        self.on_progress(len(self.pending))

    def drain(self) -> None:
        while self.pending:
            self.collect(block=True)

    def abort(self) -> None:
        """Stop: no new item starts, the running ones are killed, their records dropped."""
        self.stop.set()
        self.executor.abort()
        self.threads.shutdown(wait=True, cancel_futures=True)
        self.executor.abort()

    def concurrency(self) -> dict[str, Any]:
        described = self.executor.describe()
        return {
            "jobs": self.opts.jobs,
            **{k: v for k, v in described.items() if k != "name"},
            "executor": described["name"],
        }
