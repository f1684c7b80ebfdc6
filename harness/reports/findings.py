"""Explore mode: what each repro did in each cell, and with what, as findings rather than verdicts.

``run --explore`` (or a repro with no expectation for a mode) reports per repro and mode where it
failed as declared, where it ran, where it failed some other way, and where it could not run,
with the versions that differ between those cells (from ``run.json``: each cell's requested and
resolved packages). ``derive_expectations`` turns those observations into expectations pinned to
the versions observed, each with the command that established it, for ``--save-expectations``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from packaging.utils import canonicalize_name

from harness.records.item import ItemRecord, counts_text
from harness.records.run_meta import CellMeta
from harness.reports.outcome_table import shown
from repros.runtime.outcomes import UNOBSERVED, Outcome
from repros.runtime.spec import Expectation


def verb(outcome: str) -> str:
    """How a finding reads: the outcome's verdict (``fails as declared``, ``runs``, ``could not run``...)."""
    return shown(outcome).verdict


CellsMeta = Mapping[str, CellMeta]


def cell_versions(cells_meta: CellsMeta, cell: str) -> dict[str, str]:
    """A cell's resolved packages (canonical names), and its Python, as ``run.json`` has them."""
    info = cells_meta.get(cell)
    if info is None:
        return {}
    versions: dict[str, str] = {str(canonicalize_name(k)): str(v) for k, v in info.packages.items() if v}
    if info.python:
        versions["python"] = info.python
    return versions


def differing(records: Sequence[ItemRecord], cells_meta: CellsMeta) -> list[str]:
    """The packages whose versions differ between the records' cells: those the cells ask for,
    else any resolved package (a transitive one), else none."""
    # Cells without resolved versions (no environment) tell nothing about what varies.
    cells = [c for c in dict.fromkeys(r.cell for r in records) if cell_versions(cells_meta, c)]
    if len(cells) < 2:
        return []
    versions = {c: cell_versions(cells_meta, c) for c in cells}
    requested = {canonicalize_name(p) for c in cells for p in cells_meta[c].requested}
    every = sorted({p for v in versions.values() for p in v})

    def varies(package: str) -> bool:
        return len({versions[c].get(package) for c in cells}) > 1

    asked = [p for p in every if p in requested and varies(p)]
    return asked or [p for p in every if varies(p)]


@dataclass
class Finding:
    """One repro and mode across the explored cells."""

    repro: str
    mode: str
    records: list[ItemRecord] = field(default_factory=list)

    def lines(self, cells_meta: CellsMeta) -> list[str]:
        varying = differing(self.records, cells_meta)
        out = [f"{self.repro} / {self.mode}"]
        for record in self.records:
            versions = cell_versions(cells_meta, record.cell)
            with_what = ", ".join(f"{p} {versions.get(p, '-')}" for p in varying)
            line = f"  {verb(record.outcome)} in {record.cell}" + (f" ({with_what})" if with_what else "")
            line += f": {record.outcome}"
            if record.signature:
                line += f" [{record.signature}]"
            error = record.error
            if error and record.outcome != Outcome.UNRESOLVABLE:
                line += f" - {error.type}: {error.message[:160]}"
            elif record.reasons:
                line += f" - {record.reasons[0].splitlines()[0][:160] if record.reasons[0] else ''}"
            out.append(line)
            if record.outcome == Outcome.DIFFERENT_ERROR:
                out += [f"    hint: {reason}" for reason in record.reasons]  # how it missed the declared error
        outcomes = {r.outcome for r in self.records if r.outcome not in UNOBSERVED}
        if len(outcomes) > 1:
            out.append(f"  the cells differ in: {', '.join(varying) or 'no package version (see run.json)'}")
        return out


def findings(records: Sequence[ItemRecord]) -> list[Finding]:
    """The explored records, grouped by repro and mode, in run order."""
    grouped: dict[tuple[str, str], Finding] = {}
    for record in records:
        if record.explored:
            key = (record.repro, record.mode)
            grouped.setdefault(key, Finding(*key)).records.append(record)
    return list(grouped.values())


def findings_lines(records: Sequence[ItemRecord], cells_meta: CellsMeta) -> list[str]:
    """What ``run`` (and ``report``) print after the table for the explored items."""
    found = findings(records)
    if not found:
        return []
    lines = ["explored (observations, not checked against expectations):"]
    for finding in found:
        lines += [f"  {line}" for line in finding.lines(cells_meta)]
    return lines


@dataclass(frozen=True)
class Derived:
    """Expectations derived from one repro's observations, and what could not be derived."""

    expectations: list[Expectation]
    #: The versions each observed cell ran, for merging with the repro's own expectations.
    observed_versions: list[dict[str, str]]
    skipped: list[str]


def derive_expectations(
    records: Sequence[ItemRecord], cells_meta: CellsMeta, established_by: str, today: str | None = None
) -> Derived:
    """One expectation per observed combination of the versions that differ between the cells
    (``when``: ``==`` each observed version; nothing varies: ``when`` is empty), per mode. Cells
    that ran the same versions and saw different outcomes are not saved (said in ``skipped``)."""
    day = today or dt.date.today().isoformat()
    derived: list[Expectation] = []
    observed: list[dict[str, str]] = []
    skipped: list[str] = []
    for mode in dict.fromkeys(r.mode for r in records):
        seen = [r for r in records if r.mode == mode and r.outcome not in UNOBSERVED and r.outcome != Outcome.FLAKY]
        skipped += [
            f"{r.id.label()}: its attempts disagreed ({counts_text(r.outcome_counts or {})}): not saved"
            for r in records
            if r.mode == mode and r.outcome == Outcome.FLAKY
        ]
        skipped += [
            f"{r.id.label()}: {r.outcome}, nothing observed"
            for r in records
            if r.mode == mode and r.outcome in UNOBSERVED
        ]
        varying = differing(seen, cells_meta)
        by_when: dict[tuple[tuple[str, str], ...], list[ItemRecord]] = {}
        for record in seen:
            versions = cell_versions(cells_meta, record.cell)
            observed.append(versions)
            when = tuple((p, f"=={versions[p]}") for p in varying if p in versions)
            by_when.setdefault(when, []).append(record)
        for when, group in by_when.items():
            outcomes = sorted({str(r.outcome) for r in group})
            cells = ", ".join(r.cell for r in group)
            if len(outcomes) > 1:
                skipped.append(f"{cells} ran the same versions and observed {' and '.join(outcomes)}: not saved")
                continue
            record = group[0]
            device = record.device or "unknown device"
            note = f"observed in {cells}" + (f": {', '.join(f'{p} {v[2:]}' for p, v in when)}" if when else "")
            note += f"; signature {record.signature}" if record.signature else ""
            derived.append(
                Expectation(
                    mode=mode,
                    outcome=outcomes[0],
                    when=dict(when),
                    established_by=f"{established_by} ({day}, {device}, {record.world_size} ranks)",
                    note=note,
                )
            )
    return Derived(derived, observed, skipped)
