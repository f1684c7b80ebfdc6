"""Whether a stack lies inside what a claim proved.

A stack is inside a claim when every package the failure depends on lies in the claim's ``when`` range, or,
for one ``when`` does not name, in one of its ``under`` stacks (a package a stack lacks matches a stack that
lacks it too, where the stack's source says what is absent: a lock or an interpreter, not ``--stack``); and
where the stack's device, world size and family are known, they are the claim's. Versions compare as PEP 440
says (``==2.13.0`` holds ``2.13.0+cpu``), pre-releases included.
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


def outside(claim: Claim, where: Where, depends_on: Sequence[str]) -> list[str]:
    """Why ``where`` is not inside ``claim``: one phrase per reason (empty: it is inside)."""
    reasons = []
    for package in depends_on:
        if package in claim.when:
            version = where.version(package)
            if version is None:
                reasons.append(f"{'has' if where.complete else 'names'} no {package}")
            elif not contains(claim.when[package], version):
                reasons.append(f"{package} {version} not {claim.when[package]}")
    held = [p for p in depends_on if p not in claim.when]
    if held:
        if not claim.under:
            reasons.append("not recorded what it was proven under")
        elif not any(all(held_match(stack, p, where) for p in held) for stack in claim.under):
            reasons.append(_nearest_miss(claim.under, held, where))
    if where.device is not None and claim.device is not None and claim.device != where.device:
        reasons.append(f"proven on {claim.device}, not {where.device}")
    if where.world_size is not None and where.world_size not in WorldSizes.parse(claim.world_sizes):
        reasons.append(f"proven at world sizes {claim.world_sizes}, not {where.world_size}")
    if where.family is not None and claim.family is not None and claim.family != where.family:
        reasons.append(f"proven in {claim.family}, not {where.family}")
    return reasons


def inside(claim: Claim, where: Where, depends_on: Sequence[str]) -> bool:
    return not outside(claim, where, depends_on)


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
