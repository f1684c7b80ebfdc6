"""``--reruns N``: an item whose outcome contradicts its expectation runs again, up to N times.

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
from pathlib import Path
from typing import Any

from harness.records import ItemRecord, counts_against
from repros.common.outcomes import Outcome


def contradicts_expectation(record: ItemRecord) -> bool:
    """Whether running the item again could turn its record into a match."""
    return record.get("expected") is not None and counts_against(record) and record["outcome"] != Outcome.UNRESOLVABLE


def set_aside(item_dir: Path, attempt: int) -> Path | None:
    """Move the attempt's directory out of the next attempt's way; its new path (None if it wrote none)."""
    if not item_dir.exists():
        return None
    kept = item_dir.with_name(f"{item_dir.name}.attempt-{attempt}")
    if kept.exists():
        shutil.rmtree(kept)  # left by an earlier run into this directory (--resume reruns the item whole)
    item_dir.rename(kept)
    return kept


def attempt_summary(record: ItemRecord, kept: Path | None) -> dict[str, Any]:
    error = record.get("error") or {}
    return {
        "outcome": record["outcome"],
        "signature": record.get("signature"),
        "error_type": error.get("type"),
        "message": (error.get("message") or "")[:2000],
        "wall_s": record.get("wall_s"),
        "item_dir": str(kept) if kept else None,
    }


def with_attempts(final: ItemRecord, earlier: list[dict[str, Any]]) -> ItemRecord:
    """The last attempt's record, carrying the earlier ones; a reason line says what happened."""
    if not earlier:
        return final
    final["attempts"] = earlier
    final["flaky"] = bool(final["matched"])
    first = earlier[0]
    what = first["signature"] or first["error_type"] or "no error"
    if final["matched"]:
        said = (
            f"flaky: attempt 1 observed {first['outcome']} ({what}) against the expected {final['expected']}; "
            f"attempt {len(earlier) + 1} matched"
        )
    else:
        outcomes = ", ".join(a["outcome"] for a in earlier)
        said = f"ran {len(earlier) + 1} times, never as expected: {outcomes}, then {final['outcome']}"
    kept = [Path(a["item_dir"]).name for a in earlier if a["item_dir"]]
    if kept:
        said += f"; kept beside the item: {', '.join(kept)}"
    final["reasons"] = [*final.get("reasons", []), said]
    return final
