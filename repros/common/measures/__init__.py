"""The measures a rank takes while it trains: one module each, registered here.

A new measure is one module (a ``Meter`` subclass declaring its ``Measure``) plus its line in
``METERS``; the orchestrator merges it into the item record by its declared reduction.
Standard library only at import: meters import torch inside their methods.
"""

from __future__ import annotations

from repros.common.measures.base import Measure, Meter, Reduction
from repros.common.measures.peak_memory import PeakMemory
from repros.common.measures.step_cpu_time import StepCpuTime
from repros.common.measures.step_cuda_time import StepCudaTime
from repros.common.measures.step_time import StepTime
from repros.common.measures.train_peak_memory import TrainPeakMemory
from repros.common.measures.train_peak_reserved import TrainPeakReserved

#: Every meter a rank runs, in the order they are driven (the whole-life peak reads its counter
#: before the training's peak resets it) and their fields appear in a record.
METERS: tuple[type[Meter], ...] = (
    PeakMemory, TrainPeakMemory, TrainPeakReserved, StepTime, StepCpuTime, StepCudaTime
)
MEASURES: tuple[Measure, ...] = tuple(m.measure for m in METERS)

__all__ = ["MEASURES", "METERS", "Measure", "Meter", "Reduction"]
