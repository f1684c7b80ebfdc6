"""Which of a record's figures to show and compare, read from the measures' declarations.

Memory: the headline memory measure that was measured (the training's own peak above its
baseline before the process's whole-life peak: ``headline`` in each ``Measure``). Step time: the
headline time measure (process CPU time per step, which a busy machine does not inflate, before
wall time). Two records are compared only on a figure both took the same way: the same measure,
the same kind, and where the measure says a kind depends on the launcher, the same launcher.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.records.item import ItemRecord, StepTime, headline
from repros.runtime.measures import Measure, Quantity, measures


@dataclass(frozen=True)
class Memory:
    bytes: int
    kind: str
    #: The measure's label: "training peak", "process peak"...
    what: str


@dataclass(frozen=True)
class Steps:
    summary: StepTime
    #: The measure's label: "CPU", "wall"...
    what: str


def _memory(record: ItemRecord, measure: Measure) -> Memory | None:
    figure = record.figure(measure.name)
    if figure is None or figure.value is None:
        return None
    return Memory(int(figure.value), str(figure.kind), measure.label)


def _steps(record: ItemRecord, measure: Measure) -> Steps | None:
    figure = record.figure(measure.name)
    if figure is None or figure.steps is None:
        return None
    return Steps(figure.steps, measure.label)


def memory(record: ItemRecord) -> Memory | None:
    found = headline(record, Quantity.MEMORY)
    return _memory(record, found[0]) if found else None


def steps(record: ItemRecord) -> Steps | None:
    found = headline(record, Quantity.TIME)
    return _steps(record, found[0]) if found else None


def headline_measures(quantity: Quantity) -> list[Measure]:
    """A quantity's headline measures, the one shown first first."""
    return sorted(
        (m for m in measures() if m.quantity is quantity and m.headline is not None), key=lambda m: m.headline or 0
    )


def _same_launcher_needed(measure: Measure, kind: str) -> bool:
    return kind in measure.launcher_dependent_kinds


def comparable_memory(old: ItemRecord, new: ItemRecord) -> tuple[Memory, Memory] | None:
    """Two records' memory figures of the first measure both took the same way (else None)."""
    for measure in headline_measures(Quantity.MEMORY):
        a, b = _memory(old, measure), _memory(new, measure)
        if a is None or b is None or a.kind != b.kind:
            continue
        if _same_launcher_needed(measure, a.kind) and (old.launcher or "torchrun") != (new.launcher or "torchrun"):
            return None  # a forked rank never touches the pages of imports it does not use
        return a, b
    return None


def comparable_steps(old: ItemRecord, new: ItemRecord) -> tuple[Steps, Steps] | None:
    for measure in headline_measures(Quantity.TIME):
        a, b = _steps(old, measure), _steps(new, measure)
        if a is not None and b is not None:
            return a, b
    return None
