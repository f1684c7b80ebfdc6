"""Each cell's environment made ready in the background, the items of a cell dispatched as soon as
its environment is: the first cell's items do not wait for the last cell's build.

Builds run on threads of their own, one at a time on a small machine (a build takes every core it
can: DeepSpeed's setup, uv's copies, hashing) and side by side on a bigger one (one per
``CORES_PER_BUILD`` cores). They share the cores with the items of the cells already ready: on a
small machine the builds, not the items, are what a cold run waits for at the end.

The order puts the cheapest first result first (``build_order``): environments already built (a
check, well under a second) before any build, the cheapest build first, then the cells with the
most items. The main thread keeps recording items while it waits; with ``--jobs 1`` a cell's items
go once the previous cell's are recorded (records come cell by cell, as they always did).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from harness.config.matrix import Cell
from harness.environments import Environments, Resolved
from harness.execution.scheduler import Machine
from harness.pipeline.dispatch import Dispatch

#: Cores a build keeps busy: builds run side by side on a machine with this many per build.
CORES_PER_BUILD = 4
#: How often the main thread looks up from waiting for an environment to record finished items.
POLL_S = 0.2


@dataclass(frozen=True)
class ReadyCell:
    cell: Cell
    resolved: Resolved
    #: When its build (or check) started and ended, in the run's monotonic seconds.
    started_s: float
    ended_s: float


def builders_for(machine: Machine, cells: int) -> int:
    """How many environments are made ready at once: one per ``CORES_PER_BUILD`` cores, at least one."""
    return max(1, min(cells, machine.cpus // CORES_PER_BUILD))


def _request(cell: Cell) -> tuple[object, ...]:
    """What makes two cells' environments the same (their provider gets them one environment)."""
    return (
        cell.provider,
        tuple(sorted(cell.packages.items())),
        cell.python,
        cell.exclude_newer,
        cell.exclude_packages,
        cell.as_of,
        cell.prerelease,
        cell.lock,
    )


def _deepspeed_wheel(cell: Cell) -> tuple[object, ...] | None:
    """What a cell's DeepSpeed wheel (built by DeepSpeed's setup against torch) is shared by: its
    DeepSpeed and torch, its Python; None where it has no DeepSpeed to build."""
    if cell.packages.get("deepspeed") is None:
        return None
    return (cell.packages.get("deepspeed"), cell.packages.get("torch"), cell.python)


def build_order(cells: Sequence[Cell], cached: Callable[[Cell], bool], items: Mapping[str, int]) -> list[Cell]:
    """``cells`` in the order their environments are made ready. Those ready already come first (a
    check each), the cell with the most items first. Then the builds: the first is the cheapest, a
    build whose DeepSpeed wheel an earlier cell built (or without DeepSpeed) before one that builds
    its own, so that the first result comes soonest; after it, a cell whose environment an earlier
    cell's is comes at once, and the others by their items, most first: each distinct wheel is
    built once whatever the order, and a cell with many items keeps the machine busy while the
    next environments are built (few items last: the run does not end waiting for a long build).
    Plan order among equals."""
    ready = sorted((c for c in cells if cached(c)), key=lambda c: -items.get(c.name, 0))
    ordered = list(ready)
    requests = {_request(c) for c in ready}
    wheels = {_deepspeed_wheel(c) for c in ready}
    rest = [c for c in cells if c not in ready]
    while rest:

        def cost(cell: Cell) -> int:
            if _request(cell) in requests:
                return 0  # the environment of a cell before it
            group = _deepspeed_wheel(cell)
            return 1 if group is None or group in wheels else 2  # 2: builds its DeepSpeed wheel

        first_build = len(ordered) == len(ready)
        pick = min(
            rest,
            key=lambda c: (cost(c) if first_build else min(cost(c), 1), -items.get(c.name, 0), rest.index(c)),
        )
        rest.remove(pick)
        ordered.append(pick)
        requests.add(_request(pick))
        wheels.add(_deepspeed_wheel(pick))
    return ordered


class EnvironmentStage:
    """The cells' environments, made ready on background threads in ``build_order``."""

    def __init__(
        self, environments: Environments, cells: Sequence[Cell], builders: int, items: Mapping[str, int]
    ) -> None:
        self.environments = environments
        self.order = build_order(cells, environments.cached, items)
        self.builders = max(1, builders)
        self._next = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ready: queue.Queue[ReadyCell] = queue.Queue()
        self._delivered = 0
        self._underway: list[str] = []
        self._threads: list[threading.Thread] = []
        self._origin = time.monotonic()
        #: Seconds the run had no item in flight while it waited for an environment.
        self.waited_s = 0.0
        #: Each cell's start and end (seconds since the stage was made), as they were delivered.
        self.cells: dict[str, dict[str, float]] = {}

    def start(self) -> None:
        for n in range(min(self.builders, len(self.order))):
            thread = threading.Thread(target=self._build, name=f"environments-{n}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _take(self) -> Cell | None:
        with self._lock:
            if self._stop.is_set() or self._next >= len(self.order):
                return None
            cell = self.order[self._next]
            self._next += 1
            self._underway.append(cell.name)
            return cell

    def _build(self) -> None:
        while (cell := self._take()) is not None:
            started = time.monotonic() - self._origin
            resolved = self.environments.for_cell(cell)
            if self._stop.is_set():
                return  # stopped meanwhile (an interrupt): what it made is not reported
            with self._lock:
                self._underway.remove(cell.name)
            self._ready.put(ReadyCell(cell, resolved, started, time.monotonic() - self._origin))

    @property
    def finished(self) -> bool:
        return self._delivered >= len(self.order)

    def next_ready(self, timeout_s: float | None) -> ReadyCell | None:
        """The next cell whose environment is ready, waiting up to ``timeout_s`` (None: not at all)."""
        if self.finished:
            return None
        try:
            ready = self._ready.get(timeout=timeout_s) if timeout_s is not None else self._ready.get_nowait()
        except queue.Empty:
            return None
        self._delivered += 1
        return ready

    def dispatch_as_ready(
        self,
        dispatch: Dispatch,
        items_of: Callable[[ReadyCell], None],
        one_at_a_time: bool,
        on_ready: Callable[[ReadyCell], None] = lambda ready: None,
    ) -> None:
        """Hand each cell to ``items_of`` once its environment is ready (``on_ready`` as it is), recording
        finished items meanwhile (on this thread); then wait for every item. ``one_at_a_time`` (``--jobs
        1``): a cell's items go once the previous cell's are all recorded, so that records come cell by
        cell, as they always did, while the next environments are built."""
        self.start()
        waiting: deque[ReadyCell] = deque()
        try:
            while not self.finished or waiting:
                if dispatch.pending:
                    dispatch.collect(block=True)  # back at the first item that finishes
                    ready = self.next_ready(None)
                else:
                    looked = time.monotonic()
                    ready = self.next_ready(POLL_S)
                    if not waiting:
                        self.waited_s += time.monotonic() - looked  # nothing to run: waiting for one
                if ready is not None:
                    self.cells[ready.cell.name] = {
                        "started_s": round(ready.started_s, 2),
                        "ready_s": round(ready.ended_s, 2),
                    }
                    on_ready(ready)
                    waiting.append(ready)
                while waiting and not (one_at_a_time and dispatch.pending):
                    items_of(waiting.popleft())
            dispatch.drain()
        finally:
            self.stop()

    def describe(self) -> dict[str, object]:
        """For ``run.json``: the order, how many at once, each cell's start and end, the wait."""
        return {
            "order": [c.name for c in self.order],
            "builders": self.builders,
            "cells": dict(self.cells),
            "waited_s": round(self.waited_s, 2),
        }

    def stop(self) -> None:
        """No more builds start; one under way is stopped (its processes killed) and not reported."""
        self._stop.set()
        if any(t.is_alive() for t in self._threads):
            self.environments.cancel_builds()

    def underway(self) -> list[str]:
        """The cells whose environment is being made ready now (for the progress line)."""
        with self._lock:
            return list(self._underway)
