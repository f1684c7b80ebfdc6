"""Merge the ranks' measures into an item's figures, by each measure's declared reduction.

Each rank records ``measures.<name>`` for every meter it ran (``repros/runtime/measures``);
``summarise`` turns them into the item's ``Figure`` per measure: for a figure per rank, the
maximum over ranks (with its kind and each rank's figure); for a figure per step, each step's
slowest rank, summarised over the steps after warm-up (median, min, max, iqr, n).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence

from harness.records.item import Figure, StepTime
from harness.records.rank import Measured, RankRecord
from repros.runtime.measures import Measure, Reduction, measures


def _measured(records: Iterable[RankRecord], name: str) -> list[tuple[RankRecord, Measured]]:
    return [(rec, rec.measures[name]) for rec in records if name in rec.measures]


def step_summary(values: Sequence[float]) -> StepTime | None:
    """Median, min, max, interquartile range and count of per-step figures."""
    if not values:
        return None
    quartiles = statistics.quantiles(values, n=4, method="inclusive") if len(values) >= 2 else [values[0]] * 3
    return StepTime(
        median=statistics.median(values),
        min=min(values),
        max=max(values),
        iqr=quartiles[2] - quartiles[0],
        n=len(values),
    )


def slowest_rank_per_step(records: Iterable[RankRecord], name: str) -> StepTime | None:
    """A step lasts as long as its slowest rank: the summary over each step's maximum, after warm-up."""
    per_rank = [
        [float(v) for v in result.per_step or []][rec.warmup_steps :]
        for rec, result in _measured(records, name)
        if result.per_step
    ]
    per_rank = [times for times in per_rank if times]
    if not per_rank:
        return None
    steps = min(len(times) for times in per_rank)
    return step_summary([max(times[i] for times in per_rank) for i in range(steps)])


def _one_kind(kinds: set[str]) -> str | None:
    return kinds.pop() if len(kinds) == 1 else ",".join(sorted(kinds)) or None


def max_over_ranks(records: Iterable[RankRecord], name: str) -> Figure:
    """The largest rank's figure, its kind, and each rank's figure."""
    per_rank: dict[str, int] = {}
    kinds: set[str] = set()
    for rec, result in _measured(records, name):
        if result.value is not None:
            per_rank[str(rec.rank)] = int(result.value)
            if result.kind:
                kinds.add(result.kind)
    ordered = dict(sorted(per_rank.items(), key=lambda kv: int(kv[0])))
    return Figure(value=max(per_rank.values()) if per_rank else None, kind=_one_kind(kinds), per_rank=ordered)


def _figure(measure: Measure, records: Sequence[RankRecord]) -> Figure:
    if measure.reduction is Reduction.MAX_OVER_RANKS:
        return max_over_ranks(records, measure.name)
    steps = slowest_rank_per_step(records, measure.name)
    # A kind only where the measure keeps one (a field to write it in): what is read back is what was built.
    kinds = {r.kind for _, r in _measured(records, measure.name) if r.kind} if measure.kind_field else set()
    return Figure(value=steps.median if steps else None, kind=kinds.pop() if len(kinds) == 1 else None, steps=steps)


def summarise(records: Sequence[RankRecord]) -> dict[str, Figure]:
    """Every registered measure's figure for an item whose ranks recorded ``records``."""
    return {measure.name: _figure(measure, records) for measure in measures()}
