"""How many items may run at once, and holding their share of the machine while they do.

An item of world size N runs N ranks. On CPU each rank is one process with one
OpenMP thread (torchrun's default, kept by both launchers), so it needs a core of its
own; where GPUs are visible each rank also needs a GPU of its own. Memory is counted
per rank from a budget (``MEMORY_PER_RANK_BYTES``, above every peak RSS measured for
the built-in repros). ``--jobs N`` lets at most N items run at once, and only as many as
the free cores, GPUs and memory cover: the machine is never oversubscribed. One item
that needs more than the whole machine still runs, alone.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from harness.execution.gpu_lease import visible_gpus

#: Host memory budgeted per rank (peak RSS per rank measured here: 0.4-0.8 GiB).
MEMORY_PER_RANK_BYTES = 1 << 30


@dataclass(frozen=True)
class Machine:
    cpus: int
    memory_bytes: int
    gpus: tuple[str, ...] = ()

    @classmethod
    def detect(cls) -> Machine:
        return cls(cpus=len(os.sched_getaffinity(0)), memory_bytes=available_memory(), gpus=tuple(visible_gpus()))

    def describe(self) -> str:
        gpus = f", {len(self.gpus)} GPUs" if self.gpus else ", no GPU"
        return f"{self.cpus} cores, {self.memory_bytes / 2**30:.1f} GiB available{gpus}"


def available_memory(meminfo: str = "/proc/meminfo") -> int:
    try:
        with open(meminfo) as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@dataclass(frozen=True)
class Demand:
    cpus: int
    memory_bytes: int
    gpus: int

    @classmethod
    def for_item(cls, world_size: int, machine: Machine) -> Demand:
        return cls(
            cpus=world_size,
            memory_bytes=world_size * MEMORY_PER_RANK_BYTES,
            gpus=world_size if machine.gpus else 0,
        )


def items_at_once(machine: Machine, demand: Demand, jobs: int) -> int:
    """How many items of ``demand`` run at once on ``machine`` under ``--jobs`` (0: no cap)."""
    fit = min(
        machine.cpus // max(demand.cpus, 1),
        machine.memory_bytes // max(demand.memory_bytes, 1),
        len(machine.gpus) // demand.gpus if demand.gpus else machine.cpus,
    )
    if jobs:
        fit = min(fit, jobs)
    return max(1, fit)


@dataclass
class Slots:
    """The machine's cores, memory and GPUs, shared by the items running at once."""

    machine: Machine
    jobs: int
    _running: int = 0
    _cpus: int = 0
    _memory: int = 0
    _free_gpus: list[str] = field(default_factory=list)
    _cond: threading.Condition = field(default_factory=threading.Condition)
    #: The most items that ran at once (for the record).
    peak: int = 0

    def __post_init__(self) -> None:
        self._free_gpus = list(self.machine.gpus)

    def _fits(self, demand: Demand) -> bool:
        if self._running == 0:
            return True  # never wait forever: an item bigger than the machine runs alone
        if self.jobs and self._running >= self.jobs:
            return False
        return (
            self._cpus + demand.cpus <= self.machine.cpus
            and self._memory + demand.memory_bytes <= self.machine.memory_bytes
            and demand.gpus <= len(self._free_gpus)
        )

    @contextmanager
    def hold(self, demand: Demand) -> Iterator[list[str]]:
        """Wait until ``demand`` fits, hold it for the block, and yield the GPUs it got."""
        with self._cond:
            self._cond.wait_for(lambda: self._fits(demand))
            self._running += 1
            self._cpus += demand.cpus
            self._memory += demand.memory_bytes
            gpus = self._free_gpus[: demand.gpus]
            del self._free_gpus[: demand.gpus]
            self.peak = max(self.peak, self._running)
        try:
            yield gpus
        finally:
            with self._cond:
                self._running -= 1
                self._cpus -= demand.cpus
                self._memory -= demand.memory_bytes
                self._free_gpus.extend(gpus)
                self._cond.notify_all()
