"""Wall time of each step's timed sections (forward, backward, optimizer step), synchronised
with the device on CUDA so queued kernels are counted."""

from __future__ import annotations

import time
from typing import Any

from repros.runtime.measures.base import Measure, Meter, Quantity, Reduction


class StepTime(Meter):
    measure = Measure(
        name="step_time",
        field="step_time_s",
        kind_field=None,
        reduction=Reduction.SLOWEST_RANK_PER_STEP,
        description="wall seconds per step (the slowest rank), median and spread after warm-up",
        quantity=Quantity.TIME,
        label="wall",
        headline=2,
    )

    def __init__(self, device: Any) -> None:
        super().__init__(device)
        self.per_step: list[float] = []
        self._current = 0.0
        self._started: float | None = None

    def _sync(self) -> None:
        if self.device_type == "cuda":
            import torch

            torch.cuda.synchronize(self.device)

    def resume(self) -> None:
        self._sync()
        self._started = time.perf_counter()

    def pause(self) -> None:
        self._sync()
        if self._started is None:
            raise RuntimeError("pause() without resume()")
        self._current += time.perf_counter() - self._started
        self._started = None

    def end_step(self) -> None:
        self.per_step.append(self._current)
        self._current = 0.0

    def result(self) -> dict[str, Any] | None:
        return {"kind": "wall", "per_step": list(self.per_step)}
