"""What a failure's claims add up to: which are contradicted, and the boundaries they draw.

**Contradictions.** A run's observation (a point) inside a claim that saw otherwise (the failure where the
claim says it is fixed, or the reverse, or another error) contradicts it: the claim keeps the observation in
``contradicted_by``, and neither is dropped. Two points at the same place that disagree contradict each other.
What observed nothing (INFRA, HANG) contradicts nothing.

**Boundaries of the catalog.** A claim that the failure is there (``REPRODUCED``) draws, for each package its
range names: where the range ends (``<v``), a fix (first good ``v``); where it starts (``>=v``), the release that
brought it (first bad ``v``); where it has no end, the failure is open upstream. The last release known bad
(and the last known good) are the highest observed by runs inside the claim, under the same stack; an
expectation that names no package is open upstream in every package the failure depends on. Each boundary is
drawn once per stack the claim was proven under, with what else held there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from harness.analysis.atlas.evidence import Drawn
from harness.analysis.atlas.model import BAD, GOOD, UNOBSERVED, Boundary, Claim, Evidence
from harness.analysis.atlas.regions import inside, observed_versions, pins_a_point, point_where, verdict_of


def is_point(claim: Claim) -> bool:
    return claim.source == "run"


def mark_contradictions(claims: Sequence[Claim], depends_on: Sequence[str]) -> list[Claim]:
    """``claims`` with every point that saw otherwise inside each kept in its ``contradicted_by``."""
    points = [c for c in claims if is_point(c) and verdict_of(c.outcome) != UNOBSERVED]
    marked = []
    for claim in claims:
        verdict = verdict_of(claim.outcome)
        against = [
            evidence
            for other in points
            if other is not claim
            and verdict_of(other.outcome) != verdict
            and inside(claim, point_where(other), depends_on, spans=False)
            for evidence in other.evidence
        ]
        unique = [e for i, e in enumerate(against) if e not in against[:i]]
        marked.append(claim.model_copy(update={"contradicted_by": unique}) if unique else claim)
    return marked


def _version(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None


def _observed(
    points: Sequence[Claim],
    package: str,
    verdict: str,
    claim: Claim,
    stack: dict[str, str],
    depends_on: Sequence[str],
) -> list[str]:
    """The releases of ``package`` the points of ``verdict`` inside ``claim`` (under ``stack``) were seen at."""
    one = claim.model_copy(update={"under": [stack] if claim.under else []})
    found = []
    for p in points:
        if verdict_of(p.outcome) != verdict:
            continue
        where = point_where(p)
        version = where.versions.get(package)
        if version and inside(one, where, depends_on, spans=False):
            found.append(version)
    return sorted(set(found), key=lambda v: _version(v) or Version("0"))


def _supporting(
    points: Sequence[Claim], claim: Claim, stack: dict[str, str], depends_on: Sequence[str]
) -> list[Evidence]:
    """The runs' observations inside ``claim`` (under ``stack``) that saw what it says."""
    one = claim.model_copy(update={"under": [stack] if claim.under else []})
    verdict = verdict_of(claim.outcome)
    found: list[Evidence] = []
    for p in points:
        if verdict_of(p.outcome) == verdict and inside(one, point_where(p), depends_on, spans=False):
            found.extend(e for e in p.evidence if e not in found)
    return found


def with_observations(claims: Sequence[Claim], depends_on: Sequence[str]) -> list[Claim]:
    """``claims`` with, in each range claim no run contradicted, the releases that runs inside its range (under
    one of its stacks, on its device) saw its outcome at added to what it observed: a range answers as far as
    what was seen of it, and runs that agree with it widen that (``regions.py``)."""
    points = [c for c in claims if is_point(c)]
    widened = []
    for claim in claims:
        if is_point(claim) or claim.contradicted or not claim.when:
            widened.append(claim)
            continue
        verdict = verdict_of(claim.outcome)
        observed = {p: list(claim.observed.get(p, [])) for p in claim.when if p in claim.observed}
        for point in points:
            if verdict_of(point.outcome) != verdict or not inside(claim, point_where(point), depends_on, spans=False):
                continue
            for package in claim.when:
                version = point_where(point).versions.get(package)
                if version is not None:
                    seen = observed.setdefault(package, observed_versions(claim, package))
                    if version not in seen:
                        seen.append(version)
        widened.append(claim.model_copy(update={"observed": observed}) if observed != claim.observed else claim)
    return widened


def _scope(claim: Claim, evidence: Sequence[Evidence]) -> dict[str, str]:
    """The device, world sizes, family and Python a claim holds for, as its evidence shows them."""
    devices = sorted({e.device for e in evidence if e.device})
    sizes = sorted({e.world_size for e in evidence if e.world_size})
    families = sorted({e.family for e in evidence if e.family})
    pythons = sorted({e.versions["python"] for e in evidence if e.versions.get("python")})
    scope = {"device": claim.device or ("any (" + ", ".join(devices) + " observed)" if devices else "any")}
    scope["world size"] = claim.world_sizes if claim.world_sizes != "any" else ", ".join(map(str, sizes)) or "any"
    if claim.family or families:
        scope["family"] = claim.family or ", ".join(families)
    if pythons:
        scope["python"] = ", ".join(pythons)
    return scope


@dataclass(frozen=True)
class _Edge:
    kind: str
    version: str
    inclusive: bool


def _edges(spec: str) -> list[_Edge]:
    """The ends of a range: ``<v``/``<=v`` (where the failure stops) and ``>=v``/``>v`` (where it starts)."""
    edges = []
    for one in SpecifierSet(spec):
        if one.operator in ("<", "<="):
            edges.append(_Edge("fixed", one.version, one.operator == "<="))
        elif one.operator in (">=", ">"):
            edges.append(_Edge("introduced", one.version, one.operator == ">="))
        elif one.operator in ("==", "==="):
            edges += [_Edge("introduced", one.version, True), _Edge("fixed", one.version, True)]
    return edges


def _good_claim(claims: Sequence[Claim], package: str, version: str | None) -> Claim | None:
    """The range claim that the failure is not there which holds ``version`` of ``package``."""
    if version is None:
        return None
    for claim in claims:
        if verdict_of(claim.outcome) == GOOD and package in claim.when and not is_point(claim):
            if SpecifierSet(claim.when[package], prereleases=True).contains(version):
                return claim
    return None


def _after(versions: Sequence[str], edge: str) -> list[str]:
    return [v for v in versions if Version(v) > Version(edge)]


def _before(versions: Sequence[str], edge: str) -> list[str]:
    return [v for v in versions if Version(v) < Version(edge)]


def catalog_boundaries(claims: Sequence[Claim], depends_on: Sequence[str]) -> list[Boundary]:
    """The boundaries the catalog's claims that the failure is there draw (see the module's text)."""
    points = [c for c in claims if is_point(c)]
    ranges = [c for c in claims if c.source == "catalog" and not pins_a_point(c, depends_on)]
    found: list[Boundary] = []
    for claim in (c for c in ranges if verdict_of(c.outcome) == BAD):
        for stack in claim.under or [{}]:
            found += _claim_boundaries(claim, stack, ranges, points, depends_on)
    return found


def _claim_boundaries(
    claim: Claim, stack: dict[str, str], ranges: Sequence[Claim], points: Sequence[Claim], depends_on: Sequence[str]
) -> list[Boundary]:
    """The boundaries one claim that the failure is there draws under one of its stacks."""
    held = {p: v for p, v in stack.items() if p in depends_on and p not in claim.when}
    evidence = [e for e in claim.evidence if all(e.versions.get(p) == v for p, v in held.items())]
    support = _supporting(points, claim, stack, depends_on)
    proven, open_upstream = "proven", "open upstream"

    def boundary(package: str, kind: str, status: str, good: Claim | None = None, **ends: str | None) -> Boundary:
        """One boundary; contradicted where its bad side or its good side (``good``) was."""
        others = {p: s for p, s in claim.when.items() if p != package}
        under = {**others, **{p: v for p, v in held.items() if p != package}, **_scope(claim, support)}
        against = [*claim.contradicted_by, *(good.contradicted_by if good is not None else [])]
        return Boundary.model_validate(
            {
                "package": package,
                "kind": kind,
                "under": under,
                "status": "contradicted" if against else status,
                "source": "catalog",
                "evidence": [*evidence, *support],
                "contradicted_by": [e for i, e in enumerate(against) if e not in against[:i]],
                "good": good.when[package] if good is not None else None,
                **ends,
            }
        )

    found = []
    for package in list(claim.when) or list(depends_on):
        bad_seen = _observed(points, package, BAD, claim, stack, depends_on)
        if package not in claim.when:
            pinned = stack.get(package, "")
            last = bad_seen[-1] if bad_seen else (pinned[2:] if pinned.startswith("==") else None)
            found.append(boundary(package, "open", open_upstream, last_bad=last, bad="every release measured"))
            continue
        spec = claim.when[package]
        without = claim.model_copy(update={"when": {p: s for p, s in claim.when.items() if p != package}})
        good_seen = _observed(points, package, GOOD, without, stack, depends_on)
        edges = _edges(spec)
        for edge in edges:
            if edge.kind == "fixed":
                last_bad: str | None
                first_good: str | None
                if edge.inclusive:
                    later = _after(good_seen, edge.version)
                    last_bad, first_good = edge.version, (later[0] if later else None)
                else:
                    below = _before(bad_seen, edge.version)
                    last_bad, first_good = (below[-1] if below else None), edge.version
                good = _good_claim(ranges, package, first_good)
                found.append(
                    boundary(package, "fixed", proven, good, last_bad=last_bad, first_good=first_good, bad=spec)
                )
            else:
                earlier = _before(good_seen, edge.version)
                last_good = earlier[-1] if earlier else None
                first_bad = edge.version if edge.inclusive else None
                good = _good_claim(ranges, package, last_good)
                found.append(
                    boundary(package, "introduced", proven, good, last_good=last_good, first_bad=first_bad, bad=spec)
                )
        if not any(e.kind == "fixed" for e in edges):
            found.append(
                boundary(package, "open", open_upstream, last_bad=bad_seen[-1] if bad_seen else None, bad=spec)
            )
    return found


def merged(boundaries: Sequence[Boundary]) -> list[Boundary]:
    """Boundaries that say the same (a failure decided by one package, drawn under two stacks that differ only in
    packages it does not depend on) once, with the evidence of each."""
    found: dict[str, Boundary] = {}
    for boundary in boundaries:
        key = boundary.model_dump_json(exclude={"evidence", "contradicted_by"})
        if key not in found:
            found[key] = boundary
            continue
        kept = found[key]
        evidence = [*kept.evidence, *(e for e in boundary.evidence if e not in kept.evidence)]
        against = [*kept.contradicted_by, *(e for e in boundary.contradicted_by if e not in kept.contradicted_by)]
        found[key] = kept.model_copy(update={"evidence": evidence, "contradicted_by": against})
    return list(found.values())


def drawn_boundaries(drawn: Sequence[Drawn], claims: Sequence[Claim]) -> list[Boundary]:
    """A bisect's or a culprit's boundary, contradicted where a run contradicted a side of it."""
    found = []
    for one in drawn:
        sides = [c for c in claims if any(c.evidence == side.evidence and c.when == side.when for side in one.claims)]
        against = [e for side in sides for e in side.contradicted_by]
        boundary = one.boundary
        if against:
            boundary = boundary.model_copy(update={"status": "contradicted", "contradicted_by": against})
        if boundary not in found:
            found.append(boundary)
    return found
