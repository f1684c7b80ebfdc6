"""CUDA only: the caching allocator's reserved memory at its peak while training, above what it
held right before the first step (``reset_peak_memory_stats`` there, ``max_memory_reserved`` at
the end; kind ``cuda_reserved_above_baseline``). Reserved is what the device cannot give anyone
else, fragmentation included, so an out-of-memory is judged against it. Nothing on CPU."""

from __future__ import annotations

from typing import Any

from repros.runtime.measures.base import Measure, Meter, Quantity, Reduction


class TrainPeakReserved(Meter):
    measure = Measure(
        name="train_peak_reserved",
        field="train_peak_mem_reserved_bytes",
        kind_field=None,
        reduction=Reduction.MAX_OVER_RANKS,
        description="CUDA: the allocator's reserved memory at its training peak above its baseline (max over ranks)",
        quantity=Quantity.MEMORY,
        label="training peak reserved",
    )

    def __init__(self, device: Any) -> None:
        super().__init__(device)
        self.baseline: int | None = None

    def training_begins(self) -> None:
        if self.device_type != "cuda":
            return
        import torch

        # TrainPeakMemory, driven just before, has synchronised and reset the peaks.
        self.baseline = int(torch.cuda.memory_reserved(self.device))

    def result(self) -> dict[str, Any] | None:
        if self.baseline is None:
            return None
        import torch

        peak = int(torch.cuda.max_memory_reserved(self.device))
        return {"kind": "cuda_reserved_above_baseline", "value": max(0, peak - self.baseline)}
