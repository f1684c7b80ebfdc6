"""``run --shard I/N``: split a lane's items over N runners, deterministically.

Every shard plans the whole lane, then keeps its own part of it, so N runners that
see the same matrix, repros and durations split it the same way, with nothing to
coordinate. The split balances time: each item weighs what it took the last time it
ran (``wall_s`` of the newest record for its cell/repro/mode in the results under
the reports directory); an item never seen weighs the median of those that were
(1 s when none were). Items go heaviest first to the least loaded shard (ties: the
lower shard, then the label), and each shard keeps them in plan order.

Runners that balance by different histories would split differently, so the CI
workflow gives every shard the same downloaded history, and each shard records the
whole plan and its own part in ``run.json`` for ``merge`` to check.
"""

from __future__ import annotations

import heapq
import math
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.core.errors import UserError
from harness.records.results import RESULTS_FILE, read_results
from harness.records.run_meta import ShardMeta

_SHARD = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")
#: What an item weighs when no previous run has timed anything.
DEFAULT_WEIGHT_S = 1.0
#: The most shards a plan is split into: far more runners than any CI gives one job, and a bound on
#: what splitting costs (an N of 10^8 once took 13.5 GB; a 20-digit one, a traceback).
MAX_SHARDS = 10_000


@dataclass(frozen=True)
class Shard:
    index: int  # 1-based
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str, flag: str = "--shard") -> Shard:
    """``"2/4"`` -> Shard(2, 4); a ``UserError`` naming ``flag`` otherwise."""
    match = _SHARD.match(text)
    if not match:
        raise UserError(flag, text, "is not I/N", f"write it as I/N with 1 <= I <= N, e.g. {flag} 1/4")
    digits = len(str(MAX_SHARDS))
    if len(match[2].lstrip("0")) > digits or len(match[1].lstrip("0")) > digits or int(match[2]) > MAX_SHARDS:
        raise UserError(
            flag,
            text,
            f"splits the plan into more than {MAX_SHARDS:,} shards",
            f"give N from 1 to {MAX_SHARDS:,}: one shard per runner",
        )
    index, count = int(match[1]), int(match[2])
    if count < 1 or not 1 <= index <= count:
        raise UserError(
            flag,
            text,
            f"shard {index} of {count} does not exist",
            f"pick I from 1 to N, e.g. {flag} 1/{max(count, 1)}",
        )
    return Shard(index, count)


def label(cell: str, repro: str, mode: str) -> str:
    return f"{cell}/{repro}/{mode}"


class Durations(dict[str, float]):
    """Each item's last ``wall_s``, by label; ``skipped``: what was left out of the history it was
    read from (a file or a line that is not a run's results), one line each, for ``run.json``."""

    def __init__(self, walls: Mapping[str, float] | None = None, skipped: Sequence[str] = ()) -> None:
        super().__init__(walls or {})
        self.skipped = list(skipped)


def durations_from(reports_dir: Path) -> Durations:
    """Each item's ``wall_s`` in the newest record of it among ``reports_dir/*/results.jsonl``.
    Other runs' files are read defensively: a record that is not one (a field of the wrong type,
    an outcome that does not exist) is left out and named in ``skipped``, never trusted."""
    newest: dict[str, tuple[str, float]] = {}
    skipped: list[str] = []
    if not reports_dir.is_dir():
        return Durations()
    for path in sorted(reports_dir.glob(f"*/{RESULTS_FILE}")):
        if path.parent.name.startswith("."):
            continue  # a hidden directory is no run (a merge's staging directory)
        try:
            records = read_results(path, lenient=True)
        except (OSError, UserError) as exc:
            skipped.append(exc.line() if isinstance(exc, UserError) else f"{path}: cannot be read ({exc})")
            continue  # a damaged sibling run says nothing about durations
        skipped.extend(records.skipped)
        for record in records:
            key, wall = record.id.label(), record.wall_s
            if not math.isfinite(wall) or wall <= 0:  # nothing ran (UNRESOLVABLE...): says nothing about time
                continue
            when = record.finished_at
            if key not in newest or when >= newest[key][0]:
                newest[key] = (when, wall)
    return Durations({key: wall for key, (_, wall) in newest.items()}, skipped)


def weights(labels: Sequence[str], durations: Mapping[str, float]) -> dict[str, float]:
    known = [durations[k] for k in labels if durations.get(k, 0) > 0]
    default = statistics.median(known) if known else DEFAULT_WEIGHT_S
    return {k: durations[k] if durations.get(k, 0) > 0 else default for k in labels}


def assign(labels: Sequence[str], durations: Mapping[str, float], count: int) -> list[list[str]]:
    """Split ``labels`` into ``count`` parts of near-equal total weight (longest first)."""
    if len(set(labels)) != len(labels):
        raise ValueError("labels must be unique")
    weight = weights(labels, durations)
    # The least loaded shard takes the next item (ties: the lower shard), from a heap: time in
    # log(count) an item. Every item weighs more than 0, so the shards past the number of items
    # get none; they are never made until asked for.
    heap = [(0.0, i) for i in range(min(count, len(labels)))]
    parts: list[list[str]] = [[] for _ in heap]
    for key in sorted(labels, key=lambda k: (-weight[k], k)):
        load, target = heapq.heappop(heap)
        parts[target].append(key)
        heapq.heappush(heap, (load + weight[key], target))
    position = {k: i for i, k in enumerate(labels)}
    return [sorted(part, key=position.__getitem__) for part in parts] + [[] for _ in range(count - len(parts))]


def shard_meta(
    shard: Shard, all_labels: Sequence[str], mine: Sequence[str], durations: Mapping[str, float], reports_dir: Path
) -> ShardMeta:
    """What ``run.json`` records about a shard, for ``merge`` to check the shards fit together."""
    return ShardMeta(
        index=shard.index,
        count=shard.count,
        items=list(mine),
        planned_all=list(all_labels),
        balanced_by={
            "reports_dir": str(reports_dir),
            "items_timed": sum(1 for k in all_labels if durations.get(k, 0) > 0),
            "expected_s": round(sum(weights(all_labels, durations)[k] for k in mine), 3),
            **({"left_out": durations.skipped} if isinstance(durations, Durations) and durations.skipped else {}),
        },
    )
