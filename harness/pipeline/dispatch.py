"""Run planned items through the run's executor (``harness/pipeline/executors``), as many at once
as it takes, each by the item runner (``item_runner.py``, which decides its attempts), and record
each on the main thread as it finishes. A cell's launcher resources (its pre-imported worker) are
released once its last item is done."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from harness.config.repros import Repro
from harness.core.json import JsonObject
from harness.environments import Resolved
from harness.pipeline.executors import Executor, ItemJob
from harness.pipeline.item_runner import ItemRunner
from harness.planning.commands import repro_command
from harness.planning.items import PlannedItem, repro_of
from harness.planning.run_options import RunOptions
from harness.records.item import ItemRecord
from harness.records.run_dir import RunDir
from harness.records.run_meta import CellMeta


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
        self.pending: set[Future[ItemRecord | None]] = set()
        self.left_in_cell: dict[str, int] = {}
        self.resolved_of_cell: dict[str, Resolved | None] = {}
        self.runner = ItemRunner(executor, opts.attempts, run_dir)
        self.threads = ThreadPoolExecutor(max_workers=executor.in_flight(), thread_name_prefix="item")

    def submit(self, items: list[PlannedItem], resolved: Resolved | None, collect: bool = True) -> None:
        jobs = [self._job(item, resolved) for item in items]
        # A cluster executor may hand a cell's items to its scheduler at once (a Slurm job array).
        self.executor.submit_cell(jobs)
        for job in jobs:
            item = job.item
            self.left_in_cell[item.cell.name] = self.left_in_cell.get(item.cell.name, 0) + 1
            self.resolved_of_cell[item.cell.name] = resolved
            future = self.threads.submit(self.runner.run, job, resolved)
            self.futures[future] = (item, resolved)
            self.pending.add(future)
        if collect:
            self.collect(block=False)

    def _job(self, item: PlannedItem, resolved: Resolved | None) -> ItemJob:
        return ItemJob(
            run_id=self.run_id,
            item=item,
            repro=self.policy.repro_for(item) if self.policy.repro_for else repro_of(self.opts, item),
            repro_cmd=repro_command(self.opts, item, resolved.env if resolved is not None else None),
            known=self.known,
        )

    def unrecorded_attempts(self) -> dict[str, list[str]]:
        """The finished attempts of items with no record yet (``ItemRunner.unrecorded_attempts``)."""
        return self.runner.unrecorded_attempts()

    def collect(self, block: bool) -> None:
        done, _ = wait(self.pending, timeout=0.2 if block else 0, return_when=FIRST_COMPLETED)
        said = {c: m for c, m in self.runner.cells_seen().items() if c not in self.cells_seen}
        self.cells_seen.update(said)
        for cell, meta in said.items():
            self.on_cell(cell, meta)
        for future in done:
            self.pending.discard(future)
            item, resolved = self.futures.pop(future)
            record = future.result()
            if record is None or self.runner.stop.is_set():
                continue
            if self.policy.annotate:
                record = self.policy.annotate(record)
            self.on_record(record)
            self.runner.recorded(item)
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
        self.runner.stop.set()
        self.executor.abort()
        self.threads.shutdown(wait=True, cancel_futures=True)
        self.executor.abort()

    def concurrency(self) -> JsonObject:
        described = self.executor.describe()
        return {
            "jobs": self.opts.executor.jobs,
            **{k: v for k, v in described.items() if k != "name"},
            "executor": described["name"],
        }
