"""``python -m harness compare OLD NEW``: what changed between two runs.

Items are matched by (cell, repro, mode); an item of a cell that ``run --pin`` or ``bisect``
derived from a matrix cell (``current+peft-0.22.0``) is matched with the other run's item of that
matrix cell where no item of its own name is there. Each change gets one class:
- new regression: the item matched its expectation in OLD and does not in NEW
- fixed trainer broke: fixed mode went from PASS to anything else
- upstream fixed: bug mode went from REPRODUCED to NOT_REPRODUCED
- new error kind: NEW failed with an exception type OLD did not show
- now matches: the item did not match in OLD and does in NEW
- added / removed: the item ran in only one of the runs
- record torn: a run's results end with a record cut short (a run killed while writing it, or one
  still writing): that item is not compared, and is never shown as added or removed
- record repeated: a run's results hold an item twice; it is counted once, the last record
- memory / step time worse or better: the change exceeds the larger of a relative
  threshold, an absolute floor and (for step time) twice the measured spread (IQR)
  of the two runs; nothing inside the noise is flagged.
Only a new regression makes the exit status 1; two runs with no item in common (or one with no
whole record) make it 2, saying so: nothing was compared, which is never "no changes".
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from harness.records.item import ItemRecord
from harness.records.results import Records, torn_line
from harness.reports.figures import comparable_memory, comparable_steps
from repros.runtime.outcomes import Outcome

NEW_REGRESSION = "new regression"
FIXED_TRAINER_BROKE = "fixed trainer broke"
UPSTREAM_FIXED = "upstream fixed"
NEW_ERROR_KIND = "new error kind"
NOW_MATCHES = "now matches"
ADDED = "added"
REMOVED = "removed"
MEMORY_WORSE = "peak memory worse"
MEMORY_BETTER = "peak memory better"
TIME_WORSE = "step time worse"
TIME_BETTER = "step time better"
REPEATED = "record repeated"
TORN = "record torn"

ORDER = (
    NEW_REGRESSION,
    TORN,
    FIXED_TRAINER_BROKE,
    NEW_ERROR_KIND,
    UPSTREAM_FIXED,
    NOW_MATCHES,
    MEMORY_WORSE,
    TIME_WORSE,
    MEMORY_BETTER,
    TIME_BETTER,
    ADDED,
    REMOVED,
    REPEATED,
)


@dataclass(frozen=True)
class Thresholds:
    relative: float = 0.10
    memory_floor_bytes: int = 16 * 2**20
    time_floor_s: float = 0.005
    spread_factor: float = 2.0


@dataclass(frozen=True)
class Change:
    kind: str
    item: str
    old: str
    new: str
    detail: str = ""


Key = tuple[str, str, str, str]


def _key(record: ItemRecord) -> Key:
    # The same item at another model size is another item (its figures are not comparable).
    return record.cell, record.repro, record.mode, record.model or "tiny"


def by_item(records: Sequence[ItemRecord]) -> dict[Key, ItemRecord]:
    """Records by the item they observed (cell, repro, mode, model size)."""
    return {_key(r): r for r in records}


def _error_type(record: ItemRecord) -> str | None:
    return record.error.type if record.error else None


def _outcome(record: ItemRecord) -> str:
    mark = "✓" if record.matched else "✗"
    return f"{record.outcome} {mark}"


def _why_unmatched(record: ItemRecord) -> str:
    if record.expected:
        return f"expected {record.expected}"
    if record.outcome == Outcome.UNRESOLVABLE:
        return "no environment: " + (record.error.message if record.error else "")
    return "no expectation covers the new versions"


def _mib(n: float) -> str:
    return f"{n / 2**20:.0f} MiB"


def _performance(label: str, old: ItemRecord, new: ItemRecord, limits: Thresholds) -> list[Change]:
    changes = []
    memory = comparable_memory(old, new)
    if memory is not None:
        old_mem, new_mem, what = memory[0].bytes, memory[1].bytes, memory[0].what
        grown = new_mem - old_mem
        if old_mem > 0 and abs(grown) > max(limits.relative * old_mem, limits.memory_floor_bytes):
            kind = MEMORY_WORSE if grown > 0 else MEMORY_BETTER
            changes.append(Change(kind, label, _mib(old_mem), _mib(new_mem), f"{grown / old_mem:+.0%} ({what})"))
    times = comparable_steps(old, new)
    if times is not None:
        old_t, new_t, what = times[0].summary, times[1].summary, times[0].what
        delta = new_t.median - old_t.median
        noise = limits.spread_factor * max(old_t.iqr, new_t.iqr)
        if old_t.median > 0 and abs(delta) > max(limits.relative * old_t.median, limits.time_floor_s, noise):
            kind = TIME_WORSE if delta > 0 else TIME_BETTER
            changes.append(
                Change(
                    kind,
                    label,
                    f"{old_t.median * 1000:.0f} ms",
                    f"{new_t.median * 1000:.0f} ms",
                    f"{delta / old_t.median:+.0%} {what} (noise ±{noise * 1000:.0f} ms)",
                )
            )
    return changes


def moved_versions(before: ItemRecord, after: ItemRecord) -> dict[str, tuple[str | None, str | None]]:
    """The tracked packages whose resolved version differs between two records of an item."""
    names = dict.fromkeys([*before.versions, *after.versions])
    return {
        k: (before.versions.get(k), after.versions.get(k))
        for k in names
        if before.versions.get(k) != after.versions.get(k)
    }


def origin(record: ItemRecord) -> str:
    """The matrix cell a record's cell was derived from: itself, or the cell ``--pin`` or ``bisect``
    renamed (``current+deepspeed-0.19.2``; matrix cell names hold no ``+`` or ``@``)."""
    return record.cell_origin or re.split(r"[+@]", record.cell, maxsplit=1)[0]


def paired_records(
    old_by: dict[Key, ItemRecord], new_by: dict[Key, ItemRecord]
) -> list[tuple[str, ItemRecord | None, ItemRecord | None]]:
    """Items matched by cell, repro, mode and model; what is left is matched by the cell it was
    derived from (a ``--pin`` run against the run of its matrix cell), where that leaves one on
    each side."""
    pairs: list[tuple[str, ItemRecord | None, ItemRecord | None]] = []
    for key in sorted(set(old_by) & set(new_by)):
        pairs.append((_label(key), old_by[key], new_by[key]))
    left_old = {k: r for k, r in old_by.items() if k not in new_by}
    left_new = {k: r for k, r in new_by.items() if k not in old_by}

    def by_origin(left: dict[Key, ItemRecord]) -> dict[Key, list[Key]]:
        grouped: dict[Key, list[Key]] = {}
        for key, record in left.items():
            grouped.setdefault((origin(record), key[1], key[2], key[3]), []).append(key)
        return grouped

    olds, news = by_origin(left_old), by_origin(left_new)
    for derived in sorted(set(olds) & set(news)):
        if len(olds[derived]) == 1 and len(news[derived]) == 1:
            (old_key,), (new_key,) = olds[derived], news[derived]
            label = _label(new_key).replace(new_key[0], f"{new_key[0]} (against {old_key[0]})", 1)
            pairs.append((label, left_old.pop(old_key), left_new.pop(new_key)))
    pairs += [(_label(k), r, None) for k, r in left_old.items()]
    pairs += [(_label(k), None, r) for k, r in left_new.items()]
    return sorted(pairs, key=lambda p: p[0])


def _label(key: Key) -> str:
    return "/".join(key[:3]) + ("" if key[3] == "tiny" else f" ({key[3]} model)")


def compare_runs(
    old: Sequence[ItemRecord], new: Sequence[ItemRecord], limits: Thresholds = Thresholds()
) -> list[Change]:
    old_by, new_by = by_item(old), by_item(new)
    changes: list[Change] = _torn(old, "old") + _torn(new, "new")
    torn_items = {c.item for c in changes}
    for label, before, after in paired_records(old_by, new_by):
        if label in torn_items:
            continue  # its other record is said with the torn one: not added, not removed
        if before is None and after is not None:
            changes.append(Change(ADDED, label, "-", _outcome(after)))
            continue
        if after is None and before is not None:
            changes.append(Change(REMOVED, label, _outcome(before), "-"))
            continue
        if before is None or after is None:
            continue
        was, now = before.outcome, after.outcome
        if before.matched and not after.matched:
            changes.append(Change(NEW_REGRESSION, label, _outcome(before), _outcome(after), _why_unmatched(after)))
        elif after.scenario and was == Outcome.PASS and now != Outcome.PASS:
            # A grid combination that trained and now does not: a regression, expectation or not.
            changes.append(Change(NEW_REGRESSION, label, was, now, "a combination that trained no longer does"))
        if not before.matched and after.matched:
            changes.append(Change(NOW_MATCHES, label, _outcome(before), _outcome(after)))
        if after.mode == "fixed" and was == Outcome.PASS and now != Outcome.PASS:
            changes.append(Change(FIXED_TRAINER_BROKE, label, was, now, "; ".join(after.reasons)[:200]))
        if after.mode == "bug" and was == Outcome.REPRODUCED and now == Outcome.NOT_REPRODUCED:
            moved = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in moved_versions(before, after).items())
            changes.append(Change(UPSTREAM_FIXED, label, was, now, moved or "no tracked version moved"))
        new_type = _error_type(after)
        if new_type and new_type != _error_type(before):
            message = after.error.message if after.error else ""
            changes.append(Change(NEW_ERROR_KIND, label, _error_type(before) or "-", new_type, message[:200]))
        changes.extend(_performance(label, before, after, limits))
    changes += _repeated(old, "old") + _repeated(new, "new")
    return sorted(changes, key=lambda c: (ORDER.index(c.kind), c.item))


def _torn(records: Sequence[ItemRecord], side: str) -> list[Change]:
    """A run's torn last line: the item it was the record of (where the fragment names it), or the
    run, as a change of its own."""
    torn = torn_line(records)
    if torn is None:
        return []
    item = torn.item.label() if torn.item is not None else f"{side} run"
    detail = f"{torn.describe()}: not compared; `run --resume {torn.path.parent}` records it again"
    return [Change(TORN, item, "torn" if side == "old" else "-", "torn" if side == "new" else "-", detail)]


def unpaired_text(old: Sequence[ItemRecord], new: Sequence[ItemRecord], old_name: str, new_name: str) -> str | None:
    """Why nothing could be compared, where no item of one run pairs with one of the other (else
    None): the cells each run holds, so a run of another lane or matrix is seen for what it is."""
    if not old and not new:
        return f"nothing compared: neither {old_name} nor {new_name} holds a whole record"
    if not old or not new:
        return f"nothing compared: {new_name if not new else old_name} holds no whole record"
    if any(b is not None and a is not None for _, b, a in paired_records(by_item(old), by_item(new))):
        return None

    def cells(records: Sequence[ItemRecord]) -> str:
        names = sorted({r.cell for r in records})
        return ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")

    return (
        f"nothing compared: none of the {len(new)} items of {new_name} is an item of {old_name} "
        f"({old_name} ran cells {cells(old)}; {new_name} ran {cells(new)})"
    )


def _repeated(records: Sequence[ItemRecord], side: str) -> list[Change]:
    """What reading a run's results said of an item recorded twice (counted once, the last record)."""
    if not isinstance(records, Records):
        return []
    return [Change(REPEATED, f"{side} run", "-", "-", note) for note in records.duplicates]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(changes: Sequence[Change], old_name: str, new_name: str, unpaired: str | None = None) -> str:
    """The changes as markdown; ``unpaired``: why nothing was compared (``unpaired_text``), said first
    and never followed by "no changes"."""
    regressions = sum(1 for c in changes if c.kind == NEW_REGRESSION)
    torn = sum(1 for c in changes if c.kind == TORN)
    lines = [f"## ft-regress: {new_name} compared with {old_name}", ""]
    if unpaired:
        lines += [f"**{unpaired[0].upper()}{unpaired[1:]}.**", ""]
    elif not changes:
        lines.append("No changes: every item has the same outcome, and memory and step time moved within the noise.")
        return "\n".join(lines) + "\n"
    verdict = (
        f"**{regressions} new regression{'s' if regressions != 1 else ''}**" if regressions else "No new regression"
    )
    if torn:
        verdict += f" among the items compared; **{torn} record{'s' if torn != 1 else ''} torn**, not compared."
    elif not regressions:
        verdict += "."
    lines += [verdict, ""]
    for kind in ORDER:
        group = [c for c in changes if c.kind == kind]
        if not group:
            continue
        lines += [f"### {kind} ({len(group)})", "", "| item | before | after | detail |", "|---|---|---|---|"]
        lines += [f"| {_cell(c.item)} | {_cell(c.old)} | {_cell(c.new)} | {_cell(c.detail)} |" for c in group]
        lines.append("")
    return "\n".join(lines)
