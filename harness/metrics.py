"""Merge the ranks' measures into an item's figures, by each measure's declared reduction.

Each rank records ``measures.<name>`` for every meter it ran (``repros/common/measures``);
``summarise`` turns them into the item record's fields: for a figure per rank, the maximum
over ranks (``<field>``, ``<kind_field>`` and ``<field>_per_rank``); for a figure per step,
each step's slowest rank, summarised over the steps after warm-up (``<field>`` = median, min,
max, iqr, n).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from repros.common.measures import MEASURES, Measure, Reduction


def _measured(records: Iterable[Mapping[str, Any]], name: str) -> list[tuple[Mapping[str, Any], dict[str, Any]]]:
    found = []
    for rec in records:
        result = (rec.get("measures") or {}).get(name)
        if isinstance(result, dict):
            found.append((rec, result))
    return found


def step_summary(values: Sequence[float]) -> dict[str, float | int] | None:
    """Median, min, max, interquartile range and count of per-step figures."""
    if not values:
        return None
    quartiles = statistics.quantiles(values, n=4, method="inclusive") if len(values) >= 2 else [values[0]] * 3
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "iqr": quartiles[2] - quartiles[0],
        "n": len(values),
    }


def slowest_rank_per_step(records: Iterable[Mapping[str, Any]], name: str) -> dict[str, float | int] | None:
    """A step lasts as long as its slowest rank: the summary over each step's maximum, after warm-up."""
    per_rank = [
        [float(v) for v in result.get("per_step") or []][int(rec.get("warmup_steps") or 0) :]
        for rec, result in _measured(records, name)
        if result.get("per_step")
    ]
    if not per_rank:
        return None
    steps = min(len(times) for times in per_rank)
    return step_summary([max(times[i] for times in per_rank) for i in range(steps)])


def max_over_ranks(records: Iterable[Mapping[str, Any]], name: str) -> tuple[int | None, str | None, dict[int, int]]:
    """(the largest rank's figure, its kind, each rank's figure)."""
    per_rank: dict[int, int] = {}
    kinds: set[str] = set()
    for rec, result in _measured(records, name):
        if result.get("value") is not None and rec.get("rank") is not None:
            per_rank[int(rec["rank"])] = int(result["value"])
            if result.get("kind"):
                kinds.add(str(result["kind"]))
    if not per_rank:
        return None, None, {}
    return max(per_rank.values()), (kinds.pop() if len(kinds) == 1 else ",".join(sorted(kinds)) or None), per_rank


def _fields(measure: Measure, records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    if measure.reduction is Reduction.MAX_OVER_RANKS:
        value, kind, per_rank = max_over_ranks(records, measure.name)
        fields: dict[str, Any] = {measure.field: value}
        if measure.kind_field:
            fields[measure.kind_field] = kind
        fields[f"{measure.field}_per_rank"] = {str(k): v for k, v in sorted(per_rank.items())}
        return fields
    summary = slowest_rank_per_step(records, measure.name)
    fields = {measure.field: summary}
    if measure.kind_field:
        kinds = {str(r.get("kind")) for _, r in _measured(records, measure.name) if r.get("kind")}
        fields[measure.kind_field] = kinds.pop() if len(kinds) == 1 else None
    return fields


def summarise(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Every registered measure's fields for an item whose ranks recorded ``records``."""
    fields: dict[str, Any] = {}
    for measure in MEASURES:
        fields.update(_fields(measure, records))
    return fields


def empty_fields() -> dict[str, Any]:
    """The measure fields of an item where nothing ran."""
    return summarise([])
