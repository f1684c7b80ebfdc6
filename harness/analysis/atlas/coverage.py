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
    #: The stretches one claim of the failure proved bad along this package's own range (lowest, highest, and the
    #: first good release of a boundary drawn right after it, or None): what is proven between two releases, not
    #: only at them (a release run alone proves itself only).
    bad_stretches: tuple[tuple[str, str, str | None], ...] = ()

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
        spans: set[tuple[str, str, str | None]] = set()
        for claim in trusted:
            verdict = verdict_of(claim.outcome)
            if verdict not in sets:
                continue
            releases = claim_releases(claim, package)
            sets[verdict].update(releases)
            if verdict == BAD and package in claim.when and releases:
                ordered = sorted(releases, key=release_key)
                spans.add((ordered[0], ordered[-1], _fixed_after(entry, package, claim.when[package], ordered[-1])))
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
                bad_stretches=tuple(sorted(spans, key=lambda s: (release_key(s[0]), release_key(s[1])))),
            )
        )
    return found


def _fixed_after(entry: FailureEntry, package: str, spec: str, last: str) -> str | None:
    """The first good release of a proven boundary drawn right after ``last`` (a bisect's, whose last bad it is),
    or at the end of the range ``spec`` itself (the catalog's, drawn from that claim)."""
    for b in entry.boundaries:
        if b.package != package or b.kind != "fixed" or b.status != "proven" or not b.first_good:
            continue
        if b.last_bad == last or (b.last_bad is None and b.bad == spec):
            return b.first_good
    return None


def stretches(spans: Iterable[tuple[str, str, str | None]]) -> list[tuple[str, str | None, str]]:
    """Each stretch proven bad (lowest, highest, the release a boundary says fixed it right after), overlapping
    ones joined, oldest first, as (the first bad, the fix or None, the last bad). Only a boundary says nothing lies
    between a bad release and a good one: two releases run apart say nothing of those between."""
    joined: list[list[str | None]] = []
    for low, high, fixed in sorted(spans, key=lambda s: (release_key(s[0]), release_key(s[1]))):
        if joined and release_key(low) <= release_key(str(joined[-1][1])):
            if release_key(high) >= release_key(str(joined[-1][1])):
                joined[-1][1], joined[-1][2] = high, fixed
        else:
            joined.append([low, high, fixed])
    return [(str(low), fixed, str(high)) for low, high, fixed in joined]
