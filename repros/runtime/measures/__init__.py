"""The measures a rank takes while it trains: one module each, registered here.

A new measure is one module (a ``Meter`` subclass declaring its ``Measure``) plus its line in
``METERS``; the orchestrator merges it into the item record by its declared reduction, and every
display shows it by its declared quantity and label. ``METERS`` is read whenever it is needed
(``measures()``), never copied, so a measure registered later (a test's) is taken like the others.
A meter is registered in code, never by an installed package: the ranks run it, inside a cell's
environment, where the orchestrator's packages are not installed.
Standard library only at import: meters import torch inside their methods.
"""

from __future__ import annotations

from repros.runtime.measures.base import Measure, Meter, Quantity, Reduction
from repros.runtime.measures.peak_memory import PeakMemory
from repros.runtime.measures.step_cpu_time import StepCpuTime
from repros.runtime.measures.step_cuda_time import StepCudaTime
from repros.runtime.measures.step_time import StepTime
from repros.runtime.measures.train_peak_memory import TrainPeakMemory
from repros.runtime.measures.train_peak_reserved import TrainPeakReserved
from repros.runtime.registry import Registry

#: Every meter a rank runs, by its measure's name, in the order they are driven (the whole-life
#: peak reads its counter before the training's peak resets it) and their fields appear in a record.
METERS: Registry[type[Meter]] = Registry(
    "measure",
    {
        meter.measure.name: meter
        for meter in (PeakMemory, TrainPeakMemory, TrainPeakReserved, StepTime, StepCpuTime, StepCudaTime)
    },
)


def measures() -> tuple[Measure, ...]:
    """The declarations of the registered meters, in their order."""
    return tuple(meter.measure for meter in METERS.values())


__all__ = ["METERS", "Measure", "Meter", "Quantity", "Reduction", "measures"]
