"""The executor interface: where an item's attempt runs.

The item runner (``harness/pipeline/item_runner.py``) decides how many attempts an item gets
(``--repeat``, ``--reruns``, a lost node's retry) and the run's ``Dispatch`` records every finished
item itself; an executor only runs one attempt of one item and hands back its record. ``local`` runs
it on this machine, under ``--jobs`` and the machine's free cores, memory and GPUs. ``ray`` and
``slurm`` hand it to a cluster's own scheduler with the resources the item needs, and the node that
takes it builds the cell's environment in its own cache and launches the ranks exactly as ``local``
does (``node.py``); the record and the item's files come back to the orchestrator, which stays the
only writer of the run directory.

An attempt lost with its node (the node died, its worker was killed, the job was preempted) is
``ItemLost``: never a classified outcome. The item runner keeps it as an INFRA attempt naming the
node and runs the item again, elsewhere if the cluster has another node.

Executors are registered by name in ``EXECUTORS`` (``__init__.py``), or by an installed package
under the ``ft_regress.executors`` entry-point group: what is registered is the class
(``ExecutorKind``), made with the run's ``ExecutorContext``. The class declares the options it takes
(``options``), and the command line offers them wherever items run.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from harness.config.repros import Repro
from harness.core.json import JsonObject
from harness.core.option import Option
from harness.environments import Environments, Resolved
from harness.planning.items import PlannedItem
from harness.planning.run_options import CacheChoice, ExecutorChoice
from harness.records.item import ItemRecord
from harness.records.run_dir import RunDir
from harness.records.run_meta import CellMeta
from repros.runtime.spec import ReproSpec


@dataclass(frozen=True)
class ItemJob:
    """Everything one attempt of one item needs, on this machine or on a node (picklable)."""

    run_id: str
    item: PlannedItem
    repro: Repro
    repro_cmd: str
    #: The documented failures a DIFFERENT_ERROR is checked against.
    known: Sequence[ReproSpec] = ()
    #: Which attempt of the item this is (0: the first): a repeated crosscheck item trains from another seed.
    attempt: int = 0


@dataclass(frozen=True)
class Attempted:
    """One attempt's record, and the cell's environment as the node that ran it found it (for
    ``run.json``: remote executors build environments on the nodes, not in the orchestrator)."""

    record: ItemRecord
    cell_meta: CellMeta | None = None
    #: Which machine ran it (``None``: this one).
    node: str | None = None


class ItemLost(Exception):
    """The attempt's node went away under it: the item was not observed. ``node`` names it."""

    def __init__(self, node: str, reason: str, retry: bool = True, error_type: str = "NodeLost") -> None:
        super().__init__(f"{reason} (node {node})")
        self.node = node
        self.reason = reason
        #: The INFRA record's error type where the item is given up on.
        self.error_type = error_type
        #: False where running it again cannot help (no node of the cluster could ever take it).
        self.retry = retry


@dataclass(frozen=True)
class ExecutorContext:
    """What an executor is made with: the run, and where and how its items are to run."""

    #: The run directory (item files are written there, by the orchestrator).
    run_dir: RunDir
    run_id: str
    #: ``--executor`` and its options, ``--launcher`` (the ranks are started by it, on a node as
    #: locally) and ``--jobs``.
    choice: ExecutorChoice
    #: The environment cache: the nodes build environments in the one the user named
    #: (``--cache-dir``, a shared path), else in each node's own default one.
    cache: CacheChoice
    #: The run's environments, where the orchestrator makes them ready (the local executor).
    environments: Environments | None = None
    #: Where the launcher's own logs go (its pre-imported workers'); None: the run directory's
    #: ``workers/`` (a pytest-xdist worker keeps a folder of its own there).
    log_dir: Path | None = None

    @property
    def node_cache_dir(self) -> Path | None:
        return self.cache.cache_dir


class Executor(Protocol):
    """Runs attempts: ``place`` holds what one item needs for all its attempts (local: cores and
    GPUs; a cluster: nothing, its scheduler does), ``attempt`` runs one and returns its record or
    raises ``ItemLost``; ``in_flight`` is how many items to keep submitted at once. Optional:
    ``prepare(resolved, cell)``, a cell's environment is ready and its items will come (local: its
    worker may start ahead)."""

    name: str
    #: True where the orchestrator makes each cell's environment before its items (local); False
    #: where each node makes its own (and an item's ``Attempted.cell_meta`` says how it found it).
    builds_environments: bool

    def in_flight(self) -> int: ...

    def submit_cell(self, jobs: Sequence[ItemJob]) -> None:
        """A cell's items, before any runs: a cluster executor may submit them as one (a job array)."""
        ...

    def place(self, item: PlannedItem) -> AbstractContextManager[Sequence[str]]: ...

    def attempt(self, job: ItemJob, resolved: Resolved | None, gpus: Sequence[str]) -> Attempted: ...

    def cell_done(self, resolved: Resolved | None) -> None: ...

    def abort(self) -> None: ...

    def close(self) -> None: ...

    def describe(self) -> JsonObject: ...

    def workers(self) -> JsonObject:
        """What ``run.json`` keeps about the launcher's work, by cell (local: a pre-imported worker)."""
        ...


class ExecutorKind(Protocol):
    """What ``EXECUTORS`` holds: an executor class (or anything shaped like one). ``needs``: the Python
    package it imports and the extra that installs it (None: nothing beyond the harness); ``options``:
    the command-line options it takes, as pytest plugins declare theirs (every verb that runs items,
    the pytest plugin and ``--help`` add them; their values reach it as ``choice.executor_options``,
    by destination; an executor with none may leave it out); ``check``: what can be known of its
    options before a run starts (a value that cannot be, a cluster nothing answers at), a
    ``UserError`` where it cannot run as asked."""

    needs: tuple[str, str] | None
    options: Sequence[Option]

    def __call__(self, context: ExecutorContext) -> Executor: ...

    def check(self, choice: ExecutorChoice) -> None: ...


@contextmanager
def no_placement() -> Iterator[Sequence[str]]:
    """``place`` for an executor whose cluster places items itself."""
    yield ()
