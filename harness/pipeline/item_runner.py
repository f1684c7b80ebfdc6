"""The one way an item is run, whoever asks: ``run``'s dispatch (and so ``grid``, ``costs``,
``check``, ``watch``), ``bisect``'s steps and the pytest plugin all hand an item to an
``ItemRunner`` over the run's executor (local, or a cluster's), and get its record back.

Here, and only here, is it decided how many attempts an item gets:

- a cell with no environment: its record is UNRESOLVABLE, nothing is attempted;
- an attempt lost with its node (``ItemLost``) runs again, up to ``LOST_RETRIES`` times, each loss
  kept on the record as an INFRA attempt naming the node; an item lost every time, or that no node
  could ever take, is INFRA (never a classified outcome);
- ``--repeat N``: every item N times, the record over every attempt (FLAKY where they disagree);
- ``--reruns N``: an item whose outcome contradicts its expectation runs again, up to N times;
- ``--resume``: the attempts an interrupted run finished of the item count, and it goes on from them.

Every finished attempt is kept as it ends (``attempts.py``: its directory set aside, its record in
it), so a run stopped between two attempts loses none. asv's ``find`` runs its bisect's steps
through the same runner as ``run`` does; so does ``bisect`` here.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence

from harness.environments import Resolved
from harness.pipeline import attempts
from harness.pipeline.executors.base import Attempted, Executor, ItemJob, ItemLost
from harness.pipeline.observe import unresolvable_record
from harness.planning.items import PlannedItem
from harness.planning.run_options import AttemptPolicy
from harness.records.item import Attempt, ItemRecord
from harness.records.run_dir import RunDir
from harness.records.run_meta import CellMeta
from repros.runtime.outcomes import Outcome

#: An item whose node was lost under it runs again up to this many times; then its record is INFRA.
LOST_RETRIES = 2


class ItemRunner:
    """Runs items on ``executor`` under ``policy``; their files go under ``run_dir``. Thread-safe: a
    run's dispatch calls ``run`` from many threads at once."""

    def __init__(self, executor: Executor, policy: AttemptPolicy, run_dir: RunDir) -> None:
        self.executor = executor
        self.policy = policy
        self.run_dir = run_dir
        #: Set to stop: no attempt starts after it, and an item cut short gets no record (``run`` -> None).
        self.stop = threading.Event()
        self._lock = threading.Lock()
        #: Items with finished attempts and no record yet: each attempt's directory.
        self._unrecorded: dict[str, list[str]] = {}
        #: How each node found a cell's environment, from the first attempt that said (remote executors).
        self._cells: dict[str, CellMeta] = {}

    def run(self, job: ItemJob, resolved: Resolved | None) -> ItemRecord | None:
        """The item's record, once its attempts are decided; None where the run was stopped first.
        ``resolved``: the cell's environment where the orchestrator made it ready (None: the
        executor's nodes make it ready themselves)."""
        item = job.item
        item_dir = self.run_dir.item_dir(item.id)
        # The attempts an interrupted run finished of this item (``--resume``) count: it goes on
        # from them. What else that run left of it (the attempt it cut short) is removed.
        earlier = attempts.recover(item_dir)
        self._keep(item, earlier)
        if resolved is not None and resolved.env is None:
            return attempts.with_attempts(unresolvable_record(job, resolved.reason), earlier)
        with self.executor.place(item) as gpus:
            while True:
                if self.stop.is_set():
                    return None
                record = self._attempt(dataclasses.replace(job, attempt=len(earlier)), resolved, gpus)
                if self.stop.is_set():
                    return None  # cut short by the stop: not an attempt that finished
                if self.policy.repeat > 1 and record.outcome != Outcome.UNRESOLVABLE:
                    if len(earlier) + 1 >= self.policy.repeat:
                        kept = item_dir if item_dir.exists() else None
                        return attempts.repeated(record, earlier, kept, item.judged_as)
                elif len(earlier) >= self.policy.reruns or not attempts.contradicts_expectation(record):
                    return attempts.with_attempts(record, earlier)
                kept = attempts.set_aside(item_dir, len(earlier) + 1, record)
                earlier.append(attempts.attempt_summary(record, kept))
                self._keep(item, earlier)

    def _attempt(self, job: ItemJob, resolved: Resolved | None, gpus: Sequence[str]) -> ItemRecord:
        """One attempt's record; an attempt lost with its node is run again (``LOST_RETRIES``)."""
        lost: list[ItemLost] = []
        while True:
            try:
                attempted = self.executor.attempt(job, resolved, gpus)
            except ItemLost as exc:
                lost.append(exc)
                if exc.retry and len(lost) <= LOST_RETRIES and not self.stop.is_set():
                    continue
                return attempts.lost_record(job, lost)
            self._seen(attempted)
            return attempted.record if not lost else attempts.after_lost(attempted.record, lost)

    def _seen(self, attempted: Attempted) -> None:
        if attempted.cell_meta is not None:
            with self._lock:
                self._cells.setdefault(attempted.record.cell, attempted.cell_meta)

    def _keep(self, item: PlannedItem, earlier: list[Attempt]) -> None:
        """Note the attempts of an item not recorded yet, each kept with its own record beside the
        item (``run.json`` names them where the run stops before the item's record is written)."""
        if earlier:
            with self._lock:
                self._unrecorded[item.id.label()] = [str(a.item_dir) for a in earlier]

    def recorded(self, item: PlannedItem) -> None:
        """The item's record is written: its attempts are no longer unrecorded."""
        with self._lock:
            self._unrecorded.pop(item.id.label(), None)

    def unrecorded_attempts(self) -> dict[str, list[str]]:
        """The finished attempts of items with no record yet, by item: each attempt's directory,
        holding its record (``attempt.json``). Empty once every item started is recorded."""
        with self._lock:
            return {label: list(dirs) for label, dirs in self._unrecorded.items()}

    def cells_seen(self) -> dict[str, CellMeta]:
        """How the executor's nodes found each cell's environment so far (remote executors)."""
        with self._lock:
            return dict(self._cells)
