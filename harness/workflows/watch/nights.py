"""Two nights side by side: which items changed outcome, and which packages moved under each.

A night is a run directory (``results.jsonl`` and ``run.json``). Items are paired by cell, repro,
mode and model size, a ``--pin`` cell with its matrix cell (``compare``'s pairing). What moved is
read from each night's ``run.json``: every distribution installed in the cell's environment (the
floating cells' whole lock), so a dependency that moved is seen too; a night without it falls back
to the versions the records carry.

An item of one night with no counterpart in the other is not compared, and ``pairing`` says why
(its record there is torn, that night planned it and recorded nothing, or never planned it): a
night that pairs with nothing is never reported as a night where nothing changed.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from harness.analysis.compare import by_item, paired_records
from harness.core.as_of import as_of_day
from harness.core.errors import UserError
from harness.records.item import ItemRecord
from harness.records.results import torn_line
from harness.records.run_dir import RESULTS_FILE, RunDir
from harness.records.run_meta import RunMeta
from repros.runtime.outcomes import Outcome

Moved = dict[str, tuple[str | None, str | None]]


@dataclass(frozen=True)
class Night:
    path: Path
    meta: RunMeta
    records: list[ItemRecord]

    @classmethod
    def load(cls, path: Path, flag: str = "--previous") -> Night:
        run = RunDir(path)
        if not run.path.is_dir():
            raise UserError(flag, str(path), "is not a directory", "pass the run directory of the previous night")
        if not run.results_path.is_file():
            raise UserError(
                flag,
                str(path),
                f"holds no {RESULTS_FILE}",
                "pass the run directory of the previous night (the one with results.jsonl and run.json)",
            )
        return cls(run.path, run.read_meta(), run.records())

    def day(self) -> str:
        """The day its floating specs were resolved as of: the day before an ``--as-of`` day (what
        was released before it), the day of an ``--as-of`` time, else the day it started."""
        if self.meta.as_of:
            day = as_of_day(self.meta.as_of)
            return str(day if "T" in self.meta.as_of else day - dt.timedelta(days=1))
        started = self.meta.started_at or (self.records[0].started_at if self.records else None)
        if started:
            return str(dt.datetime.fromisoformat(started.replace("Z", "+00:00")).date())
        return str(dt.date.today())

    def installed(self, record: ItemRecord) -> dict[str, str]:
        """Every distribution of the record's cell environment, else the record's tracked versions."""
        cell = self.meta.cells.get(record.cell)
        if cell is not None and cell.packages:
            return dict(cell.packages)
        return {name: version for name, version in record.versions.items() if version}

    def lock(self, cell: str) -> tuple[str, ...] | None:
        """What a floating cell resolved to this night (None: a cell of exact pins, or not recorded)."""
        found = self.meta.cells.get(cell)
        return tuple(found.lock) if found is not None and found.lock else None


@dataclass(frozen=True)
class Candidate:
    """An item whose outcome differs between the nights."""

    before: ItemRecord
    after: ItemRecord
    moved: Moved


def outcome_changed(before: ItemRecord, after: ItemRecord) -> bool:
    """A different outcome, or the same failure with another signature or exception type."""
    if before.outcome != after.outcome:
        return True
    if after.outcome in (Outcome.PASS, Outcome.NOT_REPRODUCED, Outcome.AGREES):
        return False
    error_type = (before.error.type if before.error else None), (after.error.type if after.error else None)
    return before.signature != after.signature or error_type[0] != error_type[1]


def moved_between(previous: dict[str, str], tonight: dict[str, str]) -> Moved:
    names = sorted({*previous, *tonight})
    return {n: (previous.get(n), tonight.get(n)) for n in names if previous.get(n) != tonight.get(n)}


def changed_items(previous: Night, tonight: Night) -> list[Candidate]:
    """The items of both nights whose outcome changed, each with what moved under it."""
    found = []
    for _, before, after in paired_records(by_item(previous.records), by_item(tonight.records)):
        if before is None or after is None or not outcome_changed(before, after):
            continue
        found.append(Candidate(before, after, moved_between(previous.installed(before), tonight.installed(after))))
    return found


@dataclass(frozen=True)
class Pairing:
    """How two nights' items paired: how many were compared, and each that was not, with why."""

    compared: int
    unpaired: list[str]


def _cells(records: list[ItemRecord]) -> str:
    names = sorted({r.cell for r in records})
    return ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "") if names else "none"


def pairing(previous: Night, tonight: Night) -> Pairing:
    """Which items of the two nights were compared, and why each other one could not be."""
    torn = torn_line(previous.records)
    planned = set(previous.meta.planned)
    stopped = f" (that run was interrupted by {previous.meta.interrupted})" if previous.meta.interrupted else ""
    compared = 0
    unpaired: list[str] = []
    for label, before, after in paired_records(by_item(previous.records), by_item(tonight.records)):
        if before is not None and after is not None:
            compared += 1
        elif after is not None:
            if torn is not None and torn.item == after.id:
                why = f"its record there is torn (line {torn.line} of {torn.path.name}, cut short mid-write)"
            elif after.id.label() in planned:
                why = f"that night planned it and recorded nothing for it{stopped}"
            else:
                why = f"that night did not plan it (its cells: {_cells(previous.records)})"
            unpaired.append(f"tonight's {label} has no record in {previous.path}: {why}")
        elif before is not None:
            unpaired.append(
                f"{previous.path}'s {label} was not run tonight (tonight's cells: {_cells(tonight.records)})"
            )
    if torn is not None and (torn.item is None or torn.item not in {r.id for r in tonight.records}):
        unpaired.append(torn.describe())
    return Pairing(compared, unpaired)
