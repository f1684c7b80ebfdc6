"""The ground an atlas covers: per failure and per package that decides it, the releases proven bad, proven good,
or where something else was seen, with the stacks each was proven under.

A release is **proven bad** for a package where a claim that the failure is there (not contradicted) observed it:
the releases its range was observed at along that package, the pin of a run's point, or the release the stacks it
was proven under hold the package at. **Proven good** likewise for claims that it is not there. Every other
release is not yet known: the atlas answers ``unknown`` there (between two releases observed inside one range it
still answers, as ``regions.py`` says; the lists here name what was run). The same reading makes the OSV export's
affected versions and ranges (``osv.py``) and the page's table (``html.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from packaging.version import InvalidVersion, Version

from harness.analysis.atlas.model import BAD, GOOD, OTHER, Claim, FailureEntry
from harness.analysis.atlas.regions import observed_versions, public, verdict_of


def release_key(version: str) -> Version:
    try:
        return Version(public(version))
    except InvalidVersion:
        return Version("0")


def _pinned(spec: str) -> str | None:
    return spec[2:] if spec.startswith("==") and "," not in spec and not spec.endswith(".*") else None


def claim_releases(claim: Claim, package: str) -> list[str]:
    """The releases of ``package`` a claim's outcome was seen at: along its range, or held by its stacks."""
    if package in claim.when:
        return [public(v) for v in observed_versions(claim, package)]
    held = [_pinned(stack[package]) for stack in claim.under if package in stack]
    return [public(v) for v in held if v]


@dataclass(frozen=True)
class PackageCoverage:
    package: str
    bad: tuple[str, ...]
    good: tuple[str, ...]
    other: tuple[str, ...]
    #: For each bad release: the other packages' releases it was proven bad under (``torch==2.5.1, peft==0.14.0``).
    bad_under: dict[str, list[str]] = field(default_factory=dict)

    def releases(self) -> list[str]:
        return sorted({*self.bad, *self.good, *self.other}, key=release_key)

    def state(self, release: str) -> str | None:
        """``bad``, ``good``, ``other`` or ``mixed`` (proven both ways, under different stacks), None: not known."""
        states = {s for s, found in ((BAD, self.bad), (GOOD, self.good), (OTHER, self.other)) if release in found}
        if not states:
            return None
        return states.pop() if len(states) == 1 else "mixed"


def _under_text(claim: Claim, package: str, depends_on: Sequence[str]) -> list[str]:
    texts = []
    others = [p for p in depends_on if p != package]
    for stack in claim.under or [{}]:
        parts = [f"{p}{claim.when[p]}" for p in others if p in claim.when]
        parts += [f"{p}{stack[p]}" for p in others if p in stack and p not in claim.when]
        texts.append(", ".join(parts))
    return texts


def coverage(entry: FailureEntry) -> list[PackageCoverage]:
    """Each package that decides the failure, in ``depends_on``'s order: what was proven of its releases."""
    found = []
    trusted = [c for c in entry.claims if not c.contradicted]
    for package in entry.depends_on:
        sets: dict[str, set[str]] = {BAD: set(), GOOD: set(), OTHER: set()}
        under: dict[str, set[str]] = {}
        for claim in trusted:
            verdict = verdict_of(claim.outcome)
            if verdict not in sets:
                continue
            releases = claim_releases(claim, package)
            sets[verdict].update(releases)
            if verdict == BAD:
                for release in releases:
                    under.setdefault(release, set()).update(
                        t for t in _under_text(claim, package, entry.depends_on) if t
                    )
        found.append(
            PackageCoverage(
                package=package,
                bad=tuple(sorted(sets[BAD], key=release_key)),
                good=tuple(sorted(sets[GOOD], key=release_key)),
                other=tuple(sorted(sets[OTHER], key=release_key)),
                bad_under={k: sorted(v) for k, v in under.items()},
            )
        )
    return found


def stretches(bad: Iterable[str], good: Iterable[str]) -> list[tuple[str, str | None, str]]:
    """The runs of proven-bad releases among every proven release, oldest first: (the first bad, the first good
    after the run or None, the last bad). A release proven both ways ends nothing."""
    bad_set, good_set = set(bad), set(good) - set(bad)
    ordered = sorted(bad_set | good_set, key=release_key)
    runs: list[tuple[str, str | None, str]] = []
    start: str | None = None
    last: str | None = None
    for release in ordered:
        if release in bad_set:
            start = start or release
            last = release
        elif start is not None and last is not None:
            runs.append((start, release, last))
            start = last = None
    if start is not None and last is not None:
        runs.append((start, None, last))
    return runs
