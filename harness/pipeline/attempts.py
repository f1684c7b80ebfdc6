"""An item's attempts, kept and told: each attempt's directory set aside with its record, the
attempts an interrupted run finished taken up again, and the record that tells them all. How many
attempts an item gets is decided in one place, the item runner (``item_runner.py``): ``--reruns N``
(an item whose outcome contradicts its expectation runs again, up to N times), ``--repeat N``
(every item runs N times, a flake rate per item) and a run again after its node was lost.

``--reruns``:

Some failures are races upstream, not regressions: ZeRO-3 on gloo before deepspeed 0.19.8 now and
then reads a parameter before its gather arrived (DeepSpeed PR #8539) and trains on garbage. A
nightly lane should tell that from a version that broke, without hiding it: every attempt's
directory is kept beside the item's (``<item>.attempt-1``, ...), the final record lists the earlier
attempts and says why it ran again, and one that matched only on a rerun is ``flaky``.
Nothing is rerun that could not change: an item with no expectation (explored, a grid combination),
a cell with no environment, a run being stopped.

Every attempt that ends is recorded as it ends, not only once the item's last one does: an attempt set
aside keeps its own record beside its files (``<item>.attempt-N/attempt.json``), so a run stopped
between two attempts loses none of them. ``run --resume`` takes those attempts up again
(``recover``) and runs only the rest, and removes what an interrupted run left that no record
points to (the attempt cut short, an attempt directory with no record of its own).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections import Counter
from pathlib import Path

from harness.execution.classify import classify
from harness.pipeline.executors.base import ItemJob, ItemLost
from harness.pipeline.item_records import unobserved_record
from harness.records.item import (
    MAX_MESSAGE_CHARS,
    Attempt,
    ItemRecord,
    RecordError,
    error_summary,
    parse_record,
)
from harness.records.run_meta import utc_now
from repros.runtime.outcomes import Outcome

#: The record of an attempt set aside, in its own directory.
ATTEMPT_RECORD = "attempt.json"


def contradicts_expectation(record: ItemRecord) -> bool:
    """Whether running the item again could turn its record into a match."""
    return record.expected is not None and record.counts_against and record.outcome != Outcome.UNRESOLVABLE


def attempt_dir(item_dir: Path, attempt: int) -> Path:
    return item_dir.with_name(f"{item_dir.name}.attempt-{attempt}")


def set_aside(item_dir: Path, attempt: int, record: ItemRecord) -> Path:
    """Move the attempt's directory out of the next attempt's way, with its record written into it
    (``attempt.json``; an attempt that launched nothing gets a directory for its record alone); its
    new path."""
    kept = attempt_dir(item_dir, attempt)
    if kept.exists():
        shutil.rmtree(kept)  # no record pointed to it (``recover`` keeps those that one does)
    item_dir.mkdir(parents=True, exist_ok=True)
    _write_record(item_dir / ATTEMPT_RECORD, record.evolve(item_dir=str(kept)))
    item_dir.rename(kept)
    return kept


def _write_record(path: Path, record: ItemRecord) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(record.as_json(), fh, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _read_record(path: Path) -> ItemRecord | None:
    try:
        return parse_record(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, RecursionError, RecordError):
        return None


def recover(item_dir: Path) -> list[Attempt]:
    """The attempts of the item an earlier, interrupted run finished and set aside, each with its
    record (``attempt-1``, ``attempt-2``... while each holds a whole one), so a resumed run goes on
    from them; whatever else it left of the item is removed: the attempt it was running when it was
    stopped, and an attempt directory with no whole record (no record points to either)."""
    parent = item_dir.parent
    if not parent.is_dir():
        return []
    numbered = re.compile(rf"{re.escape(item_dir.name)}\.attempt-(\d+)")
    kept = sorted(
        (int(m[1]), p) for p in parent.iterdir() if (m := numbered.fullmatch(p.name)) is not None and p.is_dir()
    )
    recovered: list[Attempt] = []
    for number, path in kept:
        record = _read_record(path / ATTEMPT_RECORD) if number == len(recovered) + 1 else None
        if record is None or (record.cell, f"{record.repro}-{record.mode}") != (parent.name, item_dir.name):
            shutil.rmtree(path, ignore_errors=True)
            continue
        recovered.append(attempt_summary(record, path))
    if item_dir.exists():
        shutil.rmtree(item_dir, ignore_errors=True)
    return recovered


def attempt_summary(record: ItemRecord, kept: Path | None) -> Attempt:
    error = record.error
    closest = (record.crosscheck or {}).get("closest_ratio")
    return Attempt(
        outcome=record.outcome,
        signature=record.signature,
        error_type=error.type if error else None,
        message=error.message[:MAX_MESSAGE_CHARS] if error else "",
        wall_s=record.wall_s,
        item_dir=str(kept) if kept else None,
        **({"closest_ratio": closest} if isinstance(closest, int | float | str) else {}),
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


def repeated(final: ItemRecord, earlier: list[Attempt], final_dir: Path | None, kind: str) -> ItemRecord:
    """``--repeat``: the record over every attempt of an item classified as ``kind``. Where all ended the
    same way, the last attempt's record with every attempt and the count; where they did not, FLAKY
    (``classify``'s attempts step), with the counts, which attempts differed and the first error met,
    and no match."""
    every = [*earlier, attempt_summary(final, final_dir)]
    counts = dict(Counter(str(a.outcome) for a in every))
    fields: dict[str, object] = {"attempts": every, "repeat": len(every), "outcome_counts": counts}
    over = classify(kind, None, attempts=[str(a.outcome) for a in every], expected=final.expected)
    if over.outcome != Outcome.FLAKY:
        return final.evolve(**fields)
    erring = next((a for a in every if a.error_type), None)
    error = error_summary(erring.error_type or "", erring.message, None) if erring else final.error
    return final.evolve(
        outcome=Outcome.FLAKY,
        signature=None,
        matched=False,
        error=error,
        reasons=[*over.reasons, *final.reasons],
        **fields,
    )


def lost_attempt(lost: ItemLost) -> Attempt:
    """An attempt lost with its node: INFRA, naming the node."""
    return Attempt(outcome=Outcome.INFRA, error_type=lost.error_type, message=f"node {lost.node}: {lost.reason}")


def lost_record(job: ItemJob, lost: list[ItemLost]) -> ItemRecord:
    """Every attempt was lost with its node: the item is INFRA, each loss named."""
    last = lost[-1]
    said = "; ".join(f"attempt {i}: node {e.node}: {e.reason}" for i, e in enumerate(lost, 1))
    stamp = utc_now()
    record = unobserved_record(
        observation=classify(
            job.item.judged_as, None, not_started=f"the item's node was lost before it finished ({said})"
        ),
        error_type=last.error_type,
        run_id=job.run_id,
        item=job.item.id,
        world_size=job.item.world_size,
        repro_cmd=job.repro_cmd,
        started_at=stamp,
        finished_at=stamp,
        node=last.node,
    )
    return record.evolve(attempts=[lost_attempt(e) for e in lost[:-1]]) if len(lost) > 1 else record


def after_lost(record: ItemRecord, lost: list[ItemLost]) -> ItemRecord:
    """The record of the attempt that ran, after attempts lost with their nodes (kept as INFRA)."""
    nodes = ", ".join(e.node for e in lost)
    said = f"run again after its node was lost: attempt{'s' if len(lost) > 1 else ''} lost on {nodes} (INFRA)"
    if record.node:
        said += f"; this attempt ran on {record.node}"
    return record.evolve(attempts=[*(lost_attempt(e) for e in lost), *record.attempts], reasons=[*record.reasons, said])
