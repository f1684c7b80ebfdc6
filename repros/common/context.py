"""What a repro's ``run`` receives on a rank: where it runs and how to measure."""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

TRACKED_PACKAGES = ("torch", "deepspeed", "peft", "transformers", "accelerate", "bitsandbytes")


def installed_versions(packages: tuple[str, ...] = TRACKED_PACKAGES) -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in packages:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


@dataclass
class StepClock:
    """Wall time of the timed sections of each step, synchronised on CUDA."""

    device_type: str
    step_times_s: list[float] = field(default_factory=list)
    _current: float = 0.0
    _started: float | None = None

    def _sync(self) -> None:
        if self.device_type == "cuda":
            import torch

            torch.cuda.synchronize()

    def resume(self) -> None:
        self._sync()
        self._started = time.perf_counter()

    def pause(self) -> None:
        self._sync()
        if self._started is None:
            raise RuntimeError("StepClock.pause() without resume()")
        self._current += time.perf_counter() - self._started
        self._started = None

    def end_step(self) -> None:
        self.step_times_s.append(self._current)
        self._current = 0.0


@dataclass
class RankContext:
    rank: int
    local_rank: int
    world_size: int
    device: Any  # torch.device
    backend: str
    steps: int
    warmup_steps: int
    mode: str
    clock: StepClock
    #: Facts the scenario reports (training facts, guards applied); merged into the record.
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def device_type(self) -> str:
        return str(self.device.type)

    def reset_peak_memory(self) -> None:
        if self.device_type == "cuda":
            import torch

            torch.cuda.reset_peak_memory_stats(self.device)

    def peak_memory(self) -> tuple[int, str]:
        """Peak memory of this rank and what kind of figure it is."""
        if self.device_type == "cuda":
            import torch

            return int(torch.cuda.max_memory_allocated(self.device)), "cuda_max_allocated"
        # ru_maxrss is in KiB on Linux: the process's peak resident set size.
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "cpu_peak_rss"
