"""What a bisect steps over: the releases of one package (everything else as the base cell says),
or days (the base cell's packages resolved as of the end of each day, those held at their spec)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Hashable
from typing import Protocol

from harness.config.model import Cell
from harness.environments.base import EnvironmentUnavailable, EnvRequest
from harness.environments.locks import Lock
from harness.environments.specs import NEWEST, is_exact
from harness.planning.run_options import pinned_cell
from harness.records.bisect import FOUND
from harness.workflows.bisect.search import SearchResult


class Locker(Protocol):
    """What a date axis asks of the environment builder: a request's lock."""

    def lock(self, request: EnvRequest) -> Lock: ...


def final_line(package: str, result: SearchResult[str]) -> str:
    word = "first bad" if result.kind == "regression" else "first good"
    if result.status == FOUND:
        return f"{word}: {package}=={result.boundary}"
    if result.status == "ambiguous":
        unknown = ", ".join([*result.skipped, *result.others])
        candidates = ", ".join(f"{package}=={v}" for v in result.candidates)
        return f"{word}: ambiguous, one of {candidates} (no verdict on: {unknown})"
    if result.status == "non-monotonic":
        evidence = ", ".join(f"{p.point} {p.state}" for p in result.contradictions)
        return f"{word}: none, the history is not monotonic ({evidence})"
    if result.status == "endpoints-agree":
        return f"{word}: none, the endpoints do not differ"
    return f"{word}: none, an endpoint could not be observed"


class VersionAxis:
    """Bisect over the released versions of one package."""

    def __init__(self, package: str) -> None:
        self.package = package

    def label(self, point: str) -> str:
        return f"{self.package}=={point}"

    def pins(self, point: str) -> tuple[tuple[str, str], ...]:
        return ((self.package, f"=={point}"),)

    def cell(self, base: Cell, point: str) -> Cell:
        return pinned_cell(base, self.pins(point))

    def identity(self, point: str) -> Hashable:
        return point

    def final(self, result: SearchResult[str]) -> str:
        return final_line(self.package, result)


class DateAxis:
    """Bisect over days: the base cell's packages resolved as of the end of each day, every
    dependency with them; the held ones stay at the base cell's spec, the others take the newest
    release of the day (within their spec where it floats: a range stays a range). A day's environment is
    exactly its resolution (the lock), so a dependency that moved is seen too. Days that resolve
    to the same lock are one observation."""

    def __init__(self, base: Cell, builder: Locker, hold: tuple[str, ...]) -> None:
        self.base = base
        self.builder = builder
        self.hold = hold
        #: Each day resolved so far: the base cell's packages -> version.
        self.resolutions: dict[str, dict[str, str]] = {}
        #: Each day's whole lock (every package).
        self.locks: dict[str, tuple[str, ...]] = {}

    @staticmethod
    def as_of(day: str) -> str:
        """The end of ``day``: what was released up to it, before the next day began."""
        return str(dt.date.fromisoformat(day) + dt.timedelta(days=1))

    def request(self, day: str) -> EnvRequest:
        packages = {
            name: spec if name in self.hold or not is_exact(spec) else NEWEST
            for name, spec in self.base.packages.items()
        }
        return EnvRequest(
            packages=packages,
            python=self.base.python,
            exclude_newer=None,
            exclude_packages=self.base.exclude_packages,
            as_of=self.as_of(day),
            prerelease=self.base.prerelease,
        )

    def resolution(self, day: str) -> dict[str, str]:
        if day not in self.resolutions:
            lock = self.builder.lock(self.request(day))
            versions = lock.versions()
            self.locks[day] = lock.lines
            self.resolutions[day] = {name: versions[name] for name in self.base.packages if name in versions}
        return self.resolutions[day]

    def label(self, point: str) -> str:
        return point

    def pins(self, point: str) -> tuple[tuple[str, str], ...]:
        return tuple((name, f"=={version}") for name, version in sorted(self.resolution(point).items()))

    def cell(self, base: Cell, point: str) -> Cell:
        self.resolution(point)
        return dataclasses.replace(
            base,
            name=f"{base.name}@{point}",
            packages=dict(self.pins(point)),
            lock=self.locks[point],
            as_of=None,
            origin=base.origin or base.name,
        )

    def identity(self, point: str) -> Hashable:
        try:
            self.resolution(point)
        except EnvironmentUnavailable:
            return ("unresolvable", point)
        return self.locks[point]

    def moved_on(self, day: str) -> dict[str, tuple[str | None, str | None]]:
        """Every package whose resolved version differs between the day before ``day`` and ``day``."""
        before = self._all(str(dt.date.fromisoformat(day) - dt.timedelta(days=1)))
        after = self._all(day)
        return {n: (before.get(n), after.get(n)) for n in sorted({*before, *after}) if before.get(n) != after.get(n)}

    def _all(self, day: str) -> dict[str, str]:
        self.resolution(day)
        return dict(line.split("==", 1) for line in self.locks[day])

    def final(self, result: SearchResult[str]) -> str:
        line = final_line("", result).replace(" ==", " ")
        if result.status != FOUND or result.boundary is None:
            return line
        changed = [f"{n} {a or '-'} -> {b or '-'}" for n, (a, b) in self.moved_on(result.boundary).items()]
        return f"{line} ({', '.join(changed) or 'no package changed'})"
