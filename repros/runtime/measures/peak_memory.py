"""The rank's peak memory over its whole life: on CUDA ``max_memory_allocated`` since the
run began, on CPU the process's peak resident set size (imports included). The training's own
peak is another measure (``train_peak_memory.py``), which resets the kernel's and CUDA's peak
counters before the first step: the peak reached before then is kept here."""

from __future__ import annotations

import resource
from typing import Any

from repros.runtime.measures.base import Measure, Meter, Quantity, Reduction


class PeakMemory(Meter):
    measure = Measure(
        name="peak_mem",
        field="peak_mem_bytes",
        kind_field="peak_mem_kind",
        reduction=Reduction.MAX_OVER_RANKS,
        description="peak memory of the rank process (max over ranks): CUDA max allocated, or CPU peak RSS",
        quantity=Quantity.MEMORY,
        label="process peak",
        headline=2,
        launcher_dependent_kinds=("cpu_peak_rss",),
    )

    def __init__(self, device: Any) -> None:
        super().__init__(device)
        self.before_training = 0
        if self.device_type == "cuda":
            import torch

            torch.cuda.reset_peak_memory_stats(self.device)

    def _peak_so_far(self) -> int:
        if self.device_type == "cuda":
            import torch

            return int(torch.cuda.max_memory_allocated(self.device))
        # ru_maxrss is in KiB on Linux.
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024

    def training_begins(self) -> None:
        # Runs before the training's meter resets the peak counters (meters run in order).
        self.before_training = self._peak_so_far()

    def result(self) -> dict[str, Any] | None:
        kind = "cuda_max_allocated" if self.device_type == "cuda" else "cpu_peak_rss"
        return {"kind": kind, "value": max(self.before_training, self._peak_so_far())}
