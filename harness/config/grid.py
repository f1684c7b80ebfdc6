"""The config grid as the matrix declares it (``grid:``), validated.

It names the axes and their values (``repros/trainer/grid_axes.py`` says what each value changes
in a scenario), combinations that make no sense (``exclude``, each with its reason), combinations
every lane must run (``include``: the documented scenarios), how a lane covers the rest
(``coverage``: ``pairwise`` or ``product``; ``harness/planning/grid.py`` makes the combinations),
and what is expected of a combination (``expect``: rules over axis values, package versions, the
device kind and the model family, each with the command that established it;
``harness/workflows/grid.py`` judges records by them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from harness.core.errors import UserError
from repros.runtime.families import DEFAULT_FAMILY, FAMILIES
from repros.runtime.outcomes import SCENARIO_OUTCOMES
from repros.runtime.spec import DEVICES, PACKAGE_NAME
from repros.trainer.grid_axes import AXES

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
    #: Only in these model families (``repros/runtime/families.py``): an outcome the architecture decides
    #: (a LLaVA's vision tower meets F23 before F4); empty: in any.
    families: tuple[str, ...] = ()

    def names(self, signature: str | None) -> bool:
        """Whether ``signature`` is the one expected: the rule's exact signature
        (``F1.recompute-shape-0``), any of a repro's (``F5``), or anything where it names none."""
        if self.signature is None:
            return True
        return signature is not None and (signature == self.signature or signature.startswith(self.signature + "."))

    def holds(
        self,
        combination: Mapping[str, str],
        versions: Mapping[str, str | None],
        device: str | None = None,
        family: str = DEFAULT_FAMILY,
    ) -> bool:
        if not self.covers(combination):
            return False
        if self.device is not None and device != self.device:
            return False  # as a repro's expectation that names a device (harness/config/expectations.py)
        if self.families and family not in self.families:
            return False
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
        self,
        combination: Mapping[str, str],
        versions: Mapping[str, str | None],
        device: str | None = None,
        family: str = DEFAULT_FAMILY,
    ) -> GridExpectation | None:
        return next((e for e in self.expect if e.holds(combination, versions, device, family)), None)


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
            raise UserError(
                path, f"grid.coverage.{lane}", f"{how!r} is not a coverage", f"use one of: {', '.join(COVERAGES)}"
            )
        coverage[lane] = how
    include = []
    for i, combination in enumerate(raw.get("include") or []):
        where = f"grid.include[{i}]"
        values = _rule(path, where, combination, ())
        missing = [a for a in axes if a not in values]
        if missing or any(len(v) != 1 for v in values.values()):
            raise UserError(
                path, where, "is not one value per axis", f"give exactly one value of each of: {', '.join(axes)}"
            )
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
            raise UserError(
                path,
                f"{where}.outcome",
                f"{outcome!r} is not an outcome a combination can have",
                f"use one of: {', '.join(SCENARIO_OUTCOMES)}",
            )
        versions: dict[str, str] = {}
        for package, spec in {str(k): str(v) for k, v in (rule.get("versions") or {}).items()}.items():
            if not PACKAGE_NAME.fullmatch(package):
                raise UserError(
                    path,
                    f"{where}.versions",
                    f"{package!r} is not a package name",
                    "write its name on PyPI (letters, digits, '.', '_' and '-')",
                )
            versions[canonicalize_name(package)] = spec
            try:
                SpecifierSet(spec)
            except InvalidSpecifier:
                raise UserError(
                    path,
                    f"{where}.versions.{package}",
                    f"{spec!r} is not a version specifier",
                    "write it like '<0.19.3'",
                ) from None
        device = rule.get("device")
        if device is not None and device not in DEVICES:
            raise UserError(
                path, f"{where}.device", f"{device!r} is not a device kind", f"use one of: {', '.join(DEVICES)}"
            )
        raw_families = rule.get("family")
        families = tuple(str(f) for f in raw_families) if isinstance(raw_families, list) else ()
        if isinstance(raw_families, str):
            families = (raw_families,)
        if raw_families is not None and not families:
            raise UserError(path, f"{where}.family", "names no family", f"use some of: {', '.join(FAMILIES)}")
        for family in families:
            if family not in FAMILIES:
                raise UserError(
                    path, f"{where}.family", f"unknown model family {family!r}", f"use one of: {', '.join(FAMILIES)}"
                )
        expect.append(
            GridExpectation(
                match=_rule(path, where, rule.get("combination") or {}, ()),
                outcome=outcome,
                signature=rule.get("signature"),
                versions=versions,
                established_by=str(rule.get("established_by") or ""),
                device=device,
                families=families,
            )
        )
    return Grid(axes=axes, coverage=coverage, include=tuple(include), exclude=tuple(exclude), expect=tuple(expect))
