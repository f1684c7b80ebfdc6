"""The training's own peak memory: the peak while training, above the baseline taken right
before the first step (the imported libraries, the model and the engine are in the baseline).

CPU: the kernel's peak resident set size is reset to the current one right before the first
step (``/proc/self/clear_refs`` = 5); the figure is ``VmHWM`` at the end minus ``VmRSS`` then
(kind ``cpu_rss_hwm_above_baseline``). Where that reset is refused, the resident set is sampled
at every step edge instead, which can miss a peak inside a step (kind
``cpu_rss_sampled_above_baseline``). CUDA: ``reset_peak_memory_stats`` before the first step;
``max_memory_allocated`` minus the allocation then (kind ``cuda_allocated_above_baseline``).
"""

from __future__ import annotations

from typing import Any

from repros.runtime.measures.base import Measure, Meter, Quantity, Reduction


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS to its current RSS; False where the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


class TrainPeakMemory(Meter):
    measure = Measure(
        name="train_peak_mem",
        field="train_peak_mem_bytes",
        kind_field="train_peak_mem_kind",
        reduction=Reduction.MAX_OVER_RANKS,
        description="the training's peak memory above the baseline taken before the first step (max over ranks)",
        quantity=Quantity.MEMORY,
        label="training peak",
        headline=1,
    )

    def __init__(self, device: Any) -> None:
        super().__init__(device)
        self.baseline: int | None = None
        self.kind: str | None = None
        self.sampled_peak = 0

    def training_begins(self) -> None:
        if self.device_type == "cuda":
            import torch

            torch.cuda.synchronize(self.device)
            self.baseline = int(torch.cuda.memory_allocated(self.device))
            torch.cuda.reset_peak_memory_stats(self.device)
            self.kind = "cuda_allocated_above_baseline"
            return
        rss = _status_kib("VmRSS")
        if rss is None:
            return  # no /proc: nothing honest to report
        self.baseline = rss * 1024
        self.kind = "cpu_rss_hwm_above_baseline" if reset_peak_rss() else "cpu_rss_sampled_above_baseline"
        self.sampled_peak = self.baseline

    def _sample(self) -> None:
        if self.kind == "cpu_rss_sampled_above_baseline":
            rss = _status_kib("VmRSS")
            if rss is not None:
                self.sampled_peak = max(self.sampled_peak, rss * 1024)

    def resume(self) -> None:
        self._sample()

    def pause(self) -> None:
        self._sample()

    def end_step(self) -> None:
        self._sample()

    def result(self) -> dict[str, Any] | None:
        if self.baseline is None or self.kind is None:
            return None
        if self.kind == "cuda_allocated_above_baseline":
            import torch

            peak = int(torch.cuda.max_memory_allocated(self.device))
        elif self.kind == "cpu_rss_hwm_above_baseline":
            hwm = _status_kib("VmHWM")
            if hwm is None:
                return None
            peak = hwm * 1024
        else:
            self._sample()
            peak = self.sampled_peak
        return {"kind": self.kind, "value": max(0, peak - self.baseline), "baseline": self.baseline}
