"""The executor interface: where an item's attempt runs.

The run's ``Dispatch`` decides what runs (the plan, ``--repeat``, ``--reruns``, a grid's follow-ups)
and records every finished item itself; an executor only runs one attempt of one item and hands
back its record. ``local`` runs it on this machine, under ``--jobs`` and the machine's free cores,
memory and GPUs. ``ray`` and ``slurm`` hand it to a cluster's own scheduler with the resources the
item needs, and the node that takes it builds the cell's environment in its own cache and launches
the ranks exactly as ``local`` does (``node.py``); the record and the item's files come back to the
orchestrator, which stays the only writer of the run directory.

An attempt lost with its node (the node died, its worker was killed, the job was preempted) is
``ItemLost``: never a classified outcome. ``Dispatch`` keeps it as an INFRA attempt naming the
node and runs the item again, elsewhere if the cluster has another node.

Executors are registered by name in ``__init__.py``, like launchers.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from harness.config.repros import Repro
from harness.environments import Resolved
from harness.planning.items import PlannedItem
from harness.records.item import ItemRecord
from harness.records.run_meta import CellMeta
from repros.runtime.spec import ReproSpec

JsonValue = Any


@dataclass(frozen=True)
class ItemJob:
    """Everything one attempt of one item needs, on this machine or on a node (picklable)."""

    run_id: str
    item: PlannedItem
    repro: Repro
    repro_cmd: str
    #: The documented failures a DIFFERENT_ERROR is checked against.
    known: Sequence[ReproSpec] = ()


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
    """What an executor may need from the run."""

    #: The run directory's path (item files are written there, by the orchestrator).
    run_dir: Path
    #: The cache the nodes build environments in: a shared path the user named (``--cache-dir``), or
    #: ``None`` for each node's own default cache.
    node_cache_dir: Path | None
    cache_max_gb: float | None
    #: The launcher that starts the ranks (on a node as locally).
    launcher: str
    #: ``--jobs`` (local only: a cluster's scheduler decides what fits).
    jobs: int
    #: ``--ray-address``: an existing Ray cluster (None: start a local one).
    ray_address: str | None = None
    #: Where submitit keeps its jobs' files (slurm): a folder every node and the orchestrator see.
    slurm_folder: Path | None = None
    #: Extra submitit parameters (``--slurm-partition`` ...), by name.
    slurm_parameters: tuple[tuple[str, str], ...] = ()


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

    def describe(self) -> dict[str, JsonValue]: ...

    def workers(self) -> dict[str, JsonValue]:
        """What ``run.json`` keeps about the launcher's work, by cell (local: a pre-imported worker)."""
        ...


@contextmanager
def no_placement() -> Iterator[Sequence[str]]:
    """``place`` for an executor whose cluster places items itself."""
    yield ()
