"""Items run more than once: ``--reruns N`` (an item whose outcome contradicts its expectation
runs again, up to N times) and ``--repeat N`` (every item runs N times, a flake rate per item).

``--reruns``:

Some failures are races upstream, not regressions: ZeRO-3 on gloo before deepspeed 0.19.8 now and
then reads a parameter before its gather arrived (DeepSpeed PR #8539) and trains on garbage. A
nightly lane should tell that from a version that broke, without hiding it: every attempt's
directory is kept beside the item's (``<item>.attempt-1``, ...), the final record lists the earlier
attempts and says why it ran again, and one that matched only on a rerun is ``flaky``.
Nothing is rerun that could not change: an item with no expectation (explored, a grid combination),
a cell with no environment, a run being stopped.
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

from harness.records.item import MAX_MESSAGE_CHARS, Attempt, ItemRecord, counts_text, error_summary
from repros.runtime.outcomes import Outcome


def contradicts_expectation(record: ItemRecord) -> bool:
    """Whether running the item again could turn its record into a match."""
    return record.expected is not None and record.counts_against and record.outcome != Outcome.UNRESOLVABLE


def set_aside(item_dir: Path, attempt: int) -> Path | None:
    """Move the attempt's directory out of the next attempt's way; its new path (None if it wrote none)."""
    if not item_dir.exists():
        return None
    kept = item_dir.with_name(f"{item_dir.name}.attempt-{attempt}")
    if kept.exists():
        shutil.rmtree(kept)  # left by an earlier run into this directory (--resume reruns the item whole)
    item_dir.rename(kept)
    return kept


def attempt_summary(record: ItemRecord, kept: Path | None) -> Attempt:
    error = record.error
    return Attempt(
        outcome=record.outcome,
        signature=record.signature,
        error_type=error.type if error else None,
        message=error.message[:MAX_MESSAGE_CHARS] if error else "",
        wall_s=record.wall_s,
        item_dir=str(kept) if kept else None,
    )


def with_attempts(final: ItemRecord, earlier: list[Attempt]) -> ItemRecord:
    """The last attempt's record, carrying the earlier ones; a reason line says what happened."""
    if not earlier:
        return final
    first = earlier[0]
    what = first.signature or first.error_type or "no error"
    if final.matched:
        said = (
            f"flaky: attempt 1 observed {first.outcome} ({what}) against the expected {final.expected}; "
            f"attempt {len(earlier) + 1} matched"
        )
    else:
        outcomes = ", ".join(a.outcome for a in earlier)
        said = f"ran {len(earlier) + 1} times, never as expected: {outcomes}, then {final.outcome}"
    kept = [Path(a.item_dir).name for a in earlier if a.item_dir]
    if kept:
        said += f"; kept beside the item: {', '.join(kept)}"
    return final.evolve(attempts=[*earlier, *final.attempts], flaky=final.matched, reasons=[*final.reasons, said])


def repeated(final: ItemRecord, earlier: list[Attempt], final_dir: Path | None) -> ItemRecord:
    """``--repeat``: the record over every attempt. Where all ended the same way, the last attempt's
    record with every attempt and the count; where they did not, FLAKY (never silently the last
    one), with the counts, which attempts differed and the first error met, and no match."""
    every = [*earlier, attempt_summary(final, final_dir)]
    counts = dict(Counter(str(a.outcome) for a in every))
    fields: dict[str, object] = {"attempts": every, "repeat": len(every), "outcome_counts": counts}
    if len(counts) == 1:
        return final.evolve(**fields)
    usual = max(counts, key=lambda outcome: (counts[outcome], outcome == final.expected))
    odd = [str(i) for i, a in enumerate(every, 1) if a.outcome != usual]
    said = f"attempts disagree: {counts_text(counts)} (attempts {', '.join(odd)} not {usual})"
    erring = next((a for a in every if a.error_type), None)
    error = error_summary(erring.error_type or "", erring.message, None) if erring else final.error
    return final.evolve(
        outcome=Outcome.FLAKY,
        signature=None,
        matched=False,
        error=error,
        reasons=[said, *final.reasons],
        **fields,
    )
