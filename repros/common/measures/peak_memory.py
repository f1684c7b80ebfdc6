"""The rank's peak memory over its whole life: on CUDA ``max_memory_allocated`` since the
run began, on CPU the process's peak resident set size (``ru_maxrss``: imports included)."""

from __future__ import annotations

import resource
from typing import Any

from repros.common.measures.base import Measure, Meter, Reduction


class PeakMemory(Meter):
    measure = Measure(
        name="peak_mem",
        field="peak_mem_bytes",
        kind_field="peak_mem_kind",
        reduction=Reduction.MAX_OVER_RANKS,
        description="peak memory of the rank process (max over ranks): CUDA max allocated, or CPU peak RSS",
    )

    def __init__(self, device: Any) -> None:
        super().__init__(device)
        if self.device_type == "cuda":
            import torch

            torch.cuda.reset_peak_memory_stats(self.device)

    def result(self) -> dict[str, Any] | None:
        if self.device_type == "cuda":
            import torch

            return {"kind": "cuda_max_allocated", "value": int(torch.cuda.max_memory_allocated(self.device))}
        # ru_maxrss is in KiB on Linux.
        return {"kind": "cpu_peak_rss", "value": int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024}
