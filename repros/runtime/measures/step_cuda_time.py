"""Device time of each step's timed sections on CUDA (CUDA events around them); nothing on CPU."""

from __future__ import annotations

from typing import Any

from repros.runtime.measures.base import Measure, Meter, Quantity, Reduction


class StepCudaTime(Meter):
    measure = Measure(
        name="step_cuda_time",
        field="step_cuda_time_s",
        kind_field=None,
        reduction=Reduction.SLOWEST_RANK_PER_STEP,
        description="CUDA-event seconds per step (the slowest rank), median and spread after warm-up",
        quantity=Quantity.TIME,
        label="CUDA",
    )

    def __init__(self, device: Any) -> None:
        super().__init__(device)
        self.per_step: list[float] = []
        self._pairs: list[tuple[Any, Any]] = []
        self._start: Any = None

    def resume(self) -> None:
        if self.device_type != "cuda":
            return
        import torch

        self._start = torch.cuda.Event(enable_timing=True)
        self._start.record()

    def pause(self) -> None:
        if self.device_type != "cuda" or self._start is None:
            return
        import torch

        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self._pairs.append((self._start, end))
        self._start = None

    def end_step(self) -> None:
        if self.device_type != "cuda":
            return
        import torch

        torch.cuda.synchronize(self.device)
        self.per_step.append(sum(start.elapsed_time(end) for start, end in self._pairs) / 1000.0)
        self._pairs = []

    def result(self) -> dict[str, Any] | None:
        return {"kind": "cuda_event", "per_step": list(self.per_step)} if self.per_step else None
