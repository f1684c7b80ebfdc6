"""The launcher interface: what starts an item's ranks in a cell's environment.

A launcher takes a ``LaunchRequest`` (the cell's environment, the repro module, the mode,
the world size, the item's directory, its timeout) and returns a ``LaunchResult`` once every
process of the item is gone, with what the ranks recorded read back. However it starts the
ranks, it runs them as torchrun would (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``PORT``...,
``repros.runtime.rank_main`` in each), in a process group of its own that it kills on timeout
(after asking each rank for its Python stacks) and after the item, under a first process that is
the item's subreaper and is killed last, sweeping whatever escaped (the item's cgroup,
``harness/execution/containment/processes.py``) and DeepSpeed's ``/dev/shm`` segments; the ranks'
logs are copied and capped by the orchestrator (``logs.py``), and what the machine did to the
item (a full disk, its directory removed) is found after it (``diagnose.py``).

Launchers are registered by name in ``harness/execution/launchers/__init__.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from harness.core.json import JsonObject
from harness.environments import Environment
from harness.execution.launchers.result import LaunchResult


@dataclass(frozen=True)
class LaunchRequest:
    env: Environment
    #: A dotted module name (``repros.catalog.f1_...``) or a repro file's path.
    module: str
    mode: str
    world_size: int
    item_dir: Path
    timeout_s: float
    #: The cell's name (for logs), not a key: environments are shared between cells.
    cell: str = ""
    #: Variables that differ per item (``CUDA_VISIBLE_DEVICES`` from the GPU lease).
    extra_env: Mapping[str, str] = field(default_factory=dict)
    #: What the item asks of its ranks beyond the repro and the mode (JSON data: the model size,
    #: a grid scenario, a workaround variant); each rank reads it as ``ctx.params``.
    params: Mapping[str, Any] = field(default_factory=dict)
    #: Where the run writes (its directory): a full disk's reason names the largest files there.
    scan_root: Path | None = None


@dataclass(frozen=True)
class LauncherContext:
    """What a launcher may need from the run: where its own logs go."""

    log_dir: Path


class Launcher(Protocol):
    """Starts an item's ranks in a cell's environment and returns once every process of the item
    is gone: ``launch`` (thread-safe), ``cell_done`` when a cell's last item finished, ``describe``
    for ``run.json``, ``abort`` on an interrupt, ``close`` at the end of the run. Optional:
    ``prepare(env, cell)``, a cell's items are queued: start ahead what they will need (the worker
    launcher: the cell's pre-imported worker)."""

    #: Its registered name, recorded in every record it launched (``launcher``).
    name: str

    def launch(self, request: LaunchRequest) -> LaunchResult:
        """Run one item to its end (or its timeout); thread-safe."""
        ...

    def cell_done(self, env: Environment) -> None:
        """Every item of a cell using ``env`` has finished: resources kept for it may go."""
        ...

    def describe(self) -> JsonObject:
        """What ``run.json`` keeps about this launcher's work, by cell name."""
        ...

    def abort(self) -> None:
        """An interrupt: kill whatever this launcher keeps running, now."""
        ...

    def close(self) -> None:
        """The run is over: stop whatever this launcher keeps running."""
        ...
