"""Process CPU time of each step's timed sections (``time.process_time``: every thread of the
rank). Ranks run one OpenMP thread each, so on a machine shared with other work this survives
where wall time does not: it counts what the rank computed, not what it waited for."""

from __future__ import annotations

import time
from typing import Any

from repros.runtime.measures.base import Measure, Meter, Quantity, Reduction


class StepCpuTime(Meter):
    measure = Measure(
        name="step_cpu_time",
        field="step_cpu_time_s",
        kind_field=None,
        reduction=Reduction.SLOWEST_RANK_PER_STEP,
        description="process CPU seconds per step (the busiest rank), median and spread after warm-up",
        quantity=Quantity.TIME,
        label="CPU",
        headline=1,
    )

    def __init__(self, device: Any) -> None:
        super().__init__(device)
        self.per_step: list[float] = []
        self._current = 0.0
        self._started: float | None = None

    def resume(self) -> None:
        self._started = time.process_time()

    def pause(self) -> None:
        if self._started is not None:
            self._current += time.process_time() - self._started
            self._started = None

    def end_step(self) -> None:
        self.per_step.append(self._current)
        self._current = 0.0

    def result(self) -> dict[str, Any] | None:
        return {"kind": "process_cpu", "per_step": list(self.per_step)} if self.per_step else None
