"""Whether a stack lies inside what a claim proved.

A stack is inside a claim when every package the failure depends on lies in the claim's ``when`` range and
within what was observed of it there, or, for one ``when`` does not name, in one of its ``under`` stacks (a
package a stack lacks matches a stack that lacks it too, where the stack's source says what is absent: a lock
or an interpreter, not ``--stack``); and where the stack's device, world size and family are known, they are
the claim's (a claim whose device is not recorded answers for no device). Versions compare as PEP 440 says
(``==2.13.0`` holds ``2.13.0+cpu``), pre-releases included.

**Observed, not the whole specifier.** A range is proven between the releases it was observed at, not beyond:
``>=0.19.3`` observed at 0.19.3 and 0.19.8 answers for 0.19.5, never for 0.20.0 or 99.0; ``<0.19.3`` observed
at 0.19.2 answers for 0.19.2 alone, never for 0.1.0. A specifier with holes (``!=0.19.2``) is several stretches,
each proven between its own lowest and highest observed release: 0.19.1 is proven only if a release at or
above it was observed below the hole. A claim's observations grow with the runs that agree with it inside its
range (``derive.with_observations``); a run that saw otherwise inside the range contradicts it
(``spans=False``: the range as it is written, observed or not).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from harness.analysis.atlas.model import BAD, GOOD, OTHER, UNOBSERVED, Claim
from repros.runtime.outcomes import UNOBSERVED as UNOBSERVED_OUTCOMES
from repros.runtime.outcomes import Outcome
from repros.runtime.spec import WorldSizes


def verdict_of(outcome: str) -> str:
    """What an outcome of the ``bug`` mode says: the failure is there, is not, something else, or nothing."""
    if outcome == Outcome.REPRODUCED:
        return BAD
    if outcome == Outcome.NOT_REPRODUCED:
        return GOOD
    if outcome in UNOBSERVED_OUTCOMES:
        return UNOBSERVED
    return OTHER


#: The most observed releases a line lists one by one.
SHOWN_RELEASES = 8


@dataclass(frozen=True)
class Where:
    """A place to answer for: versions (canonical names; None: absent), and what else is known of the run."""

    versions: Mapping[str, str | None]
    #: Whether a package not named is absent (a lock, an interpreter, a run) or merely unsaid (``--stack``).
    complete: bool = False
    device: str | None = None
    world_size: int | None = None
    family: str | None = None

    def version(self, package: str) -> str | None:
        return self.versions.get(canonicalize_name(package))


def contains(spec: str, version: str | None) -> bool:
    """Whether ``version`` lies in the specifier ``spec`` (False for text that is neither)."""
    if version is None:
        return False
    try:
        return SpecifierSet(spec, prereleases=True).contains(Version(version))
    except (InvalidSpecifier, InvalidVersion):
        return False


def _release(text: str) -> Version | None:
    """A version as spans compare it: the release a build is of (``2.13.0+cpu`` is ``2.13.0``)."""
    try:
        return Version(Version(text).public)
    except InvalidVersion:
        return None


def _holes(spec: str) -> list[Version]:
    """Where a specifier's ``!=`` excludes releases (``!=0.19.2``, ``!=0.19.*``): the stretches' ends."""
    try:
        parsed = SpecifierSet(spec, prereleases=True)
    except InvalidSpecifier:
        return []
    found = []
    for one in parsed:
        if one.operator == "!=":
            hole = _release(one.version.removesuffix(".*"))
            if hole is not None:
                found.append(hole)
    return found


def is_pin(spec: str) -> bool:
    """``==2.5.1``: one release, not a range."""
    return spec.startswith("==") and "," not in spec and "*" not in spec


def pins_a_point(claim: Claim, depends_on: Sequence[str]) -> bool:
    """Whether the claim pins every package the failure depends on to one release (a surveyed stack's): a point,
    which draws no boundary."""
    return all(is_pin(claim.when.get(p, "")) for p in depends_on)


def observed_versions(claim: Claim, package: str) -> list[str]:
    """The releases of ``package`` the claim's outcome was observed at (a pin: its own release)."""
    if package in claim.observed:
        return list(claim.observed[package])
    spec = claim.when.get(package, "")
    pinned = spec[2:] if spec.startswith("==") and "," not in spec and not spec.endswith(".*") else None
    return [pinned] if pinned and not pinned.startswith("=") else []


def within_observed(spec: str, observed: Sequence[str], version: str) -> bool:
    """Whether ``version`` lies between two releases observed in ``spec`` with no hole of it between them."""
    at = _release(version)
    if at is None:
        return False
    seen = [v for v in (_release(o) for o in observed if contains(spec, o)) if v is not None]
    below = [v for v in seen if v <= at]
    above = [v for v in seen if v >= at]
    if not below or not above:
        return False
    low, high = max(below), min(above)
    return not any(low < hole < high for hole in _holes(spec))


def observed_text(claim: Claim, package: str) -> str:
    """What was observed of ``package`` in the claim, as a line shows it (``0.19.3..0.19.8``, ``0.19.2``)."""
    seen = sorted(set(observed_versions(claim, package)), key=lambda v: _release(v) or Version("0"))
    if not seen:
        return "no release recorded"
    return ", ".join(seen) if len(seen) <= SHOWN_RELEASES else f"{seen[0]} .. {seen[-1]}, {len(seen)} releases"


def public(version: str) -> str:
    """``2.13.0+cpu`` -> ``2.13.0``: the release a build is of."""
    try:
        return Version(version).public
    except InvalidVersion:
        return version


def held_match(stack: Mapping[str, str], package: str, where: Where) -> bool:
    """Whether ``where``'s ``package`` is the one ``stack`` holds (both without it counts, where that is known)."""
    version = where.version(package)
    if package not in stack:
        return version is None and where.complete
    return contains(stack[package], version)


def outside(claim: Claim, where: Where, depends_on: Sequence[str], spans: bool = True) -> list[str]:
    """Why ``where`` is not inside ``claim``: one phrase per reason (empty: it is inside). ``spans``: a range
    holds only what was observed of it (the answer's rule); without, the range as it is written (what a run
    that saw otherwise contradicts)."""
    reasons = []
    for package in depends_on:
        if package in claim.when:
            version = where.version(package)
            spec = claim.when[package]
            if version is None:
                reasons.append(f"{'has' if where.complete else 'names'} no {package}")
            elif not contains(spec, version):
                reasons.append(f"{package} {version} not {spec}")
            elif spans and not within_observed(spec, observed_versions(claim, package), version):
                seen = observed_text(claim, package)
                reasons.append(f"{package} {version} in {spec} but beyond what was observed there ({seen})")
    held = [p for p in depends_on if p not in claim.when]
    if held:
        if not claim.under:
            reasons.append("not recorded what it was proven under")
        elif not any(all(held_match(stack, p, where) for p in held) for stack in claim.under):
            reasons.append(_nearest_miss(claim.under, held, where))
    if where.device is not None and claim.device != where.device:
        on = f"proven on {claim.device}" if claim.device else "the device it was proven on is not recorded"
        reasons.append(f"{on}, not {where.device}")
    if where.world_size is not None and where.world_size not in WorldSizes.parse(claim.world_sizes):
        reasons.append(f"proven at world sizes {claim.world_sizes}, not {where.world_size}")
    if where.family is not None and claim.family is not None and claim.family != where.family:
        reasons.append(f"proven in {claim.family}, not {where.family}")
    return reasons


def inside(claim: Claim, where: Where, depends_on: Sequence[str], spans: bool = True) -> bool:
    return not outside(claim, where, depends_on, spans)


def matching_stack(claim: Claim, where: Where, depends_on: Sequence[str]) -> dict[str, str] | None:
    """The stack of ``claim.under`` that ``where`` lies in, for the packages ``when`` does not name."""
    held = [p for p in depends_on if p not in claim.when]
    return next((u for u in claim.under if all(held_match(u, p, where) for p in held)), None)


def _nearest_miss(stacks: Sequence[Mapping[str, str]], held: Sequence[str], where: Where) -> str:
    """The packages that keep ``where`` out of the stack it differs from least."""
    best: list[str] | None = None
    for stack in stacks:
        misses = []
        for package in held:
            if held_match(stack, package, where):
                continue
            version = where.version(package)
            have = version if version is not None else ("none" if where.complete else "not named")
            misses.append(f"{package} {have} (proven: {stack.get(package, 'none')})")
        if best is None or len(misses) < len(best):
            best = misses
    return "outside what it was proven under: " + ", ".join(best or [])


def point_where(claim: Claim) -> Where:
    """A run's observation (a point claim) as a place: its pinned versions, the rest absent."""
    versions: dict[str, str | None] = {}
    for package, spec in claim.when.items():
        versions[package] = spec[2:] if spec.startswith("==") else None
    world = WorldSizes.parse(claim.world_sizes)
    return Where(
        versions=versions,
        complete=True,
        device=claim.device,
        world_size=world.minimum if world.maximum == world.minimum else None,
        family=claim.family,
    )
