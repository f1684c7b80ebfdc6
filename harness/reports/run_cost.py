"""What a run that built environments cost, and the least it could have: said as ``run`` ends.

A first run builds the environments its cells need, then reruns are quick. Its wall is split into the
time no item could run because no environment was ready yet, the items' own walls, and the rest
(the cells' workers starting, the checks before and after each item, records, reports, the process's
start and exit). Beside it, the physical floor: the CPU seconds of the work that had to be done
whatever the harness did around it (the installer's downloads and installs, each cell's imports,
the items' ranks), spread over every core of the machine. A run on a machine shared with other
work takes longer than its floor says, and its CPU seconds are its own: what else ran meanwhile
is in neither.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from harness.records.item import ItemRecord
from harness.records.run_meta import RunMeta


def _seconds(stamp: str | None) -> float | None:
    try:
        return dt.datetime.fromisoformat(stamp).timestamp() if stamp else None
    except ValueError:
        return None


def _number(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) else 0.0


def _items_span_s(records: Sequence[ItemRecord]) -> float:
    """The time some item was running: the union of the items' spans (items run side by side with
    ``--jobs``), each span at least its wall."""
    spans = sorted(
        (start, max(end, start + r.wall_s))
        for r in records
        if (start := _seconds(r.started_at)) is not None and (end := _seconds(r.finished_at)) is not None
    )
    total, reach = 0.0, float("-inf")
    for start, end in spans:
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


@dataclass(frozen=True)
class RunCost:
    wall_s: float
    #: No item could run: no cell's environment was ready yet, or the next one was not.
    environments_s: float
    #: Some item was running (with ``--jobs 1``, the sum of the items' walls).
    items_s: float
    environments_built: int
    #: The CPU seconds of the work itself: the installer's, the cells' imports, the items' ranks.
    install_cpu_s: float
    imports_cpu_s: float
    items_cpu_s: float
    cores: int

    @property
    def rest_s(self) -> float:
        return max(0.0, self.wall_s - self.environments_s - self.items_s)

    @property
    def work_cpu_s(self) -> float:
        return self.install_cpu_s + self.imports_cpu_s + self.items_cpu_s

    @property
    def floor_s(self) -> float:
        return self.work_cpu_s / max(self.cores, 1)

    @classmethod
    def of(cls, meta: RunMeta, records: Sequence[ItemRecord], cores: int, wall_s: float | None = None) -> RunCost:
        """The run's cost from its ``run.json`` and records; ``wall_s``: the process's own wall, where
        known (else ``run.json``'s start to finish)."""
        start, end = _seconds(meta.started_at), _seconds(meta.finished_at)
        if wall_s is None:
            wall_s = (end - start) if start is not None and end is not None else 0.0
        stage = meta.environment_stage or {}
        jobs = (meta.options or {}).get("jobs")
        items_s = sum(r.wall_s for r in records) if jobs in (1, None) else _items_span_s(records)
        built = [c for c in meta.cells.values() if c.reused is False and c.build_s]
        return cls(
            wall_s=wall_s,
            environments_s=_number(stage.get("waited_s")),
            items_s=items_s,
            environments_built=len(built),
            install_cpu_s=sum(c.build_cpu_s or 0.0 for c in built),
            imports_cpu_s=sum(_number((c.worker or {}).get("cpu_s")) for c in meta.cells.values()),
            items_cpu_s=sum(r.cpu_s or 0.0 for r in records),
            cores=cores,
        )

    def lines(self) -> list[str]:
        """What a run that built environments says of its cost as it ends."""
        return [
            f"this run, building {self.environments_built} environments: {self.wall_s:.0f} s = environments "
            f"{self.environments_s:.0f} s (no item could run yet) + items {self.items_s:.0f} s + the rest "
            f"{self.rest_s:.0f} s (workers starting, checks, records, reports)",
            f"the work itself: {self.work_cpu_s:.0f} CPU-s (downloads and installs {self.install_cpu_s:.0f}, the "
            f"cells' imports {self.imports_cpu_s:.0f}, the items {self.items_cpu_s:.0f}) over {self.cores} cores: "
            f"{self.floor_s:.0f} s at the least; the next run reuses the environments",
        ]
