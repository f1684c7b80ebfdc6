"""The config grid: every combination users write, in every version cell, classified.

``matrix.yaml``'s ``grid:`` section names the axes and their values (``repros/common/grid_axes.py``
says what each value changes in a scenario), combinations that make no sense (``exclude``, each
with its reason), combinations every lane must run (``include``: the documented scenarios), how a
lane covers the rest (``coverage``: ``pairwise``, every pair of axis values at least once, by
covertable, which honours the exclusions as constraints and refuses to leave a pair uncovered;
or ``product``, every combination), and what is expected of a combination (``expect``: rules
over axis values and package versions, each with the command that established it). A combination no rule covers is reported, not failed, unless it regressed against the
previous grid run.

Each combination runs unguarded, as users write it, and is classified against every repro's
signatures (PASS, a known failure by name, SILENT_FAILURE, NEW_FAILURE, INFRA, HANG, CRASH);
a known failure is then run again through the fixed trainer's guards: does it train then?
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from harness.errors import UserError
from harness.matrix import Cell
from harness.planning import PlannedItem
from harness.records import ItemRecord
from repros.common.grid_axes import AXES, AXIS_ORDER, combination_id
from repros.common.outcomes import SCENARIO_OUTCOMES, Outcome
from repros.common.spec import DEVICES

GRID_MODULE = "repros.common.scenario_item"
AS_WRITTEN = "as-written"
GUARDED = "guarded"
COVERAGES = ("pairwise", "product")

Combination = dict[str, str]


@dataclass(frozen=True)
class Rule:
    """Combinations whose axis values are each among ``match[axis]``."""

    match: Mapping[str, tuple[str, ...]]

    def covers(self, combination: Mapping[str, str]) -> bool:
        return all(combination.get(axis) in values for axis, values in self.match.items())

    def covers_partial(self, partial: Mapping[str, str]) -> bool:
        """Only where every axis the rule names is decided (for the pairwise generator)."""
        return all(axis in partial for axis in self.match) and self.covers(partial)


@dataclass(frozen=True)
class Exclusion(Rule):
    reason: str = ""


@dataclass(frozen=True)
class GridExpectation(Rule):
    outcome: str = ""
    signature: str | None = None
    versions: Mapping[str, str] = field(default_factory=dict)
    established_by: str = ""
    #: Only on this device kind (``cpu``, ``cuda``): an outcome that depends on it (bitsandbytes
    #: refusing to quantize on a CPU under old transformers); ``None``: on any.
    device: str | None = None

    def names(self, signature: str | None) -> bool:
        """Whether ``signature`` is the one expected: the rule's exact signature
        (``F1.recompute-shape-0``), any of a repro's (``F5``), or anything where it names none."""
        if self.signature is None:
            return True
        return signature is not None and (signature == self.signature or signature.startswith(self.signature + "."))

    def holds(
        self, combination: Mapping[str, str], versions: Mapping[str, str | None], device: str | None = None
    ) -> bool:
        if not self.covers(combination):
            return False
        if self.device is not None and device != self.device:
            return False  # as a repro's expectation that names a device (harness/expectations.py)
        for package, spec in self.versions.items():
            installed = versions.get(package)
            try:
                if installed is None or Version(installed) not in SpecifierSet(spec, prereleases=True):
                    return False
            except InvalidVersion:
                return False
        return True


@dataclass(frozen=True)
class Grid:
    axes: dict[str, tuple[str, ...]]
    coverage: dict[str, str]
    include: tuple[Combination, ...] = ()
    exclude: tuple[Exclusion, ...] = ()
    expect: tuple[GridExpectation, ...] = ()

    def excluded(self, combination: Mapping[str, str]) -> Exclusion | None:
        return next((e for e in self.exclude if e.covers(combination)), None)

    def expectation(
        self, combination: Mapping[str, str], versions: Mapping[str, str | None], device: str | None = None
    ) -> GridExpectation | None:
        return next((e for e in self.expect if e.holds(combination, versions, device)), None)


def _values(path: Path, where: str, axis: str, value: Any) -> tuple[str, ...]:
    values = tuple(value) if isinstance(value, list) else (value,)
    if axis not in AXES:
        raise UserError(path, f"{where}.{axis}", f"unknown axis {axis!r}", f"use one of: {', '.join(AXES)}")
    for v in values:
        if v not in AXES[axis]:
            raise UserError(path, f"{where}.{axis}", f"unknown value {v!r}", f"use one of: {', '.join(AXES[axis])}")
    return values


def _rule(path: Path, where: str, raw: Mapping[str, Any], skip: Iterable[str]) -> dict[str, tuple[str, ...]]:
    return {axis: _values(path, where, axis, value) for axis, value in raw.items() if axis not in skip}


def load_grid(path: Path, raw: Mapping[str, Any] | None, lanes: Iterable[str]) -> Grid | None:
    """The matrix's ``grid:`` section, validated (``UserError`` naming the field and the fix)."""
    if not raw:
        return None
    axes: dict[str, tuple[str, ...]] = {}
    for axis, values in (raw.get("axes") or {}).items():
        axes[axis] = _values(path, "grid.axes", axis, values)
    if not axes:
        raise UserError(path, "grid.axes", "names no axis", f"list some of: {', '.join(AXES)}")
    known_lanes = set(lanes)
    coverage: dict[str, str] = {}
    for lane, how in (raw.get("coverage") or {}).items():
        if lane not in known_lanes:
            raise UserError(path, f"grid.coverage.{lane}", f"unknown lane {lane!r}", "declare it under 'lanes:'")
        if how not in COVERAGES:
            raise UserError(path, f"grid.coverage.{lane}", f"{how!r} is not a coverage", f"use one of: {', '.join(COVERAGES)}")
        coverage[lane] = how
    include = []
    for i, combination in enumerate(raw.get("include") or []):
        where = f"grid.include[{i}]"
        values = _rule(path, where, combination, ())
        missing = [a for a in axes if a not in values]
        if missing or any(len(v) != 1 for v in values.values()):
            raise UserError(path, where, "is not one value per axis", f"give exactly one value of each of: {', '.join(axes)}")
        include.append({a: values[a][0] for a in axes})
    exclude = []
    for i, rule in enumerate(raw.get("exclude") or []):
        where = f"grid.exclude[{i}]"
        if not str(rule.get("reason") or "").strip():
            raise UserError(path, where, "has no reason", "say why these combinations are left out (reason: ...)")
        exclude.append(Exclusion(match=_rule(path, where, rule, ("reason",)), reason=str(rule["reason"])))
    expect = []
    for i, rule in enumerate(raw.get("expect") or []):
        where = f"grid.expect[{i}]"
        outcome = str(rule.get("outcome") or "")
        if outcome not in SCENARIO_OUTCOMES:
            raise UserError(path, f"{where}.outcome", f"{outcome!r} is not an outcome a combination can have",
                            f"use one of: {', '.join(SCENARIO_OUTCOMES)}")
        versions = {str(k): str(v) for k, v in (rule.get("versions") or {}).items()}
        for package, spec in versions.items():
            try:
                SpecifierSet(spec)
            except InvalidSpecifier:
                raise UserError(path, f"{where}.versions.{package}", f"{spec!r} is not a version specifier",
                                "write it like '<0.19.3'") from None
        device = rule.get("device")
        if device is not None and device not in DEVICES:
            raise UserError(path, f"{where}.device", f"{device!r} is not a device kind",
                            f"use one of: {', '.join(DEVICES)}")
        expect.append(
            GridExpectation(
                match=_rule(path, where, rule.get("combination") or {}, ()),
                outcome=outcome,
                signature=rule.get("signature"),
                versions=versions,
                established_by=str(rule.get("established_by") or ""),
                device=device,
            )
        )
    return Grid(axes=axes, coverage=coverage, include=tuple(include), exclude=tuple(exclude), expect=tuple(expect))


def restrict(grid: Grid, only: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """The axes with ``--only AXIS=V1,V2`` applied."""
    axes = dict(grid.axes)
    for text in only:
        axis, sep, values = text.partition("=")
        if not sep or not values:
            raise UserError("--only", text, "is not AXIS=V1,V2", "write it like --only engine=deepspeed-zero3,fsdp2")
        if axis not in axes:
            raise UserError("--only", text, f"the grid has no axis {axis!r}", f"use one of: {', '.join(axes)}")
        wanted = tuple(v.strip() for v in values.split(",") if v.strip())
        unknown = [v for v in wanted if v not in axes[axis]]
        if unknown:
            raise UserError("--only", text, f"unknown value {unknown[0]!r} of {axis}", f"use one of: {', '.join(axes[axis])}")
        axes[axis] = wanted
    return axes


def combinations(grid: Grid, coverage: str, axes: Mapping[str, tuple[str, ...]]) -> list[Combination]:
    """The included combinations (within ``axes``), then the rest of the coverage, none excluded."""
    names = [a for a in AXIS_ORDER if a in axes]

    def allowed(combination: Mapping[str, str]) -> bool:
        return all(combination[a] in axes[a] for a in names) and grid.excluded(combination) is None

    chosen: list[Combination] = [dict(c) for c in grid.include if allowed(c)]
    if coverage == "product":
        rest = (dict(zip(names, values, strict=True)) for values in itertools.product(*(axes[a] for a in names)))
        chosen += [c for c in rest if allowed(c) and c not in chosen]
        return chosen
    from covertable import make

    constraints = [
        {
            "operator": "not",
            "condition": {
                "operator": "and",
                "conditions": [{"operator": "in", "left": axis, "values": list(values)} for axis, values in e.match.items()],
            },
        }
        for e in grid.exclude
    ]
    rows = make({a: list(axes[a]) for a in names}, constraints=constraints or None, presets=[dict(c) for c in chosen] or None)
    for row in rows:
        combination = {a: row[a] for a in names}
        if allowed(combination) and combination not in chosen:
            chosen.append(combination)
    return chosen


def planned(cells: Sequence[Cell], combos: Sequence[Combination]) -> list[PlannedItem]:
    return [
        PlannedItem(cell, combination_id(c), GRID_MODULE, AS_WRITTEN, cell.world_size, params={"scenario": dict(c)})
        for cell in cells
        for c in combos
    ]


def guarded_follow_up(item: PlannedItem, record: ItemRecord) -> list[PlannedItem]:
    """A known failure, as users wrote it: run it again through the fixed trainer's guards."""
    if item.mode != AS_WRITTEN or record["outcome"] != Outcome.REPRODUCED:
        return []
    return [PlannedItem(item.cell, item.repro_id, item.module, GUARDED, item.world_size, params=item.params,
                        rank_mode="fixed")]


def annotate(grid: Grid, record: ItemRecord) -> None:
    """Set the record's expectation from the grid's rules (a combination none covers: no match)."""
    combination = record.get("scenario") or {}
    if record.get("mode") != AS_WRITTEN or not combination:
        if combination:
            record["explored"] = True  # a guarded rerun answers "does it train then?": a finding
        return
    rule = grid.expectation(combination, record.get("versions") or {}, record.get("device"))
    if rule is None:
        record["explored"] = True  # reported, not failed: what it did is the finding
        return
    record["expected"] = rule.outcome
    record["expected_established_by"] = rule.established_by
    record["expected_when"] = {**{a: ",".join(v) for a, v in rule.match.items()}, **rule.versions}
    if rule.device:
        record["expected_device"] = rule.device
    record["matched"] = record["outcome"] == rule.outcome and rule.names(record.get("signature"))
