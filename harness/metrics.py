"""Merge per-rank measurements into an item's figures."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any


def step_time_summary(records: Iterable[dict[str, Any]]) -> dict[str, float | int] | None:
    """Median and spread of the step time over the steps after warm-up.

    A step lasts as long as its slowest rank, so each step's time is the maximum
    over ranks; the summary is over those per-step maxima.
    """
    per_rank = [
        list(rec.get("step_times_s") or [])[int(rec.get("warmup_steps") or 0) :]
        for rec in records
        if rec.get("step_times_s")
    ]
    if not per_rank:
        return None
    steps = min(len(times) for times in per_rank)
    if steps == 0:
        return None
    slowest = [max(times[i] for times in per_rank) for i in range(steps)]
    quartiles = statistics.quantiles(slowest, n=4, method="inclusive") if steps >= 2 else [slowest[0]] * 3
    return {
        "median": statistics.median(slowest),
        "min": min(slowest),
        "max": max(slowest),
        "iqr": quartiles[2] - quartiles[0],
        "n": steps,
    }


def peak_memory(records: Iterable[dict[str, Any]]) -> tuple[int | None, str | None, dict[int, int]]:
    """(maximum over ranks, its kind, per-rank peaks)."""
    per_rank = {
        int(rec["rank"]): int(rec["peak_mem_bytes"]) for rec in records if rec.get("peak_mem_bytes") is not None
    }
    kinds = {str(rec["peak_mem_kind"]) for rec in records if rec.get("peak_mem_kind")}
    if not per_rank:
        return None, None, {}
    return max(per_rank.values()), (kinds.pop() if len(kinds) == 1 else ",".join(sorted(kinds))), per_rank
