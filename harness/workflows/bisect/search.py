"""Binary search for the boundary between two states over an ordered list of points.

The points are released versions (or days), oldest first. Each probe says ``good``,
``bad``, ``other`` (observed, but neither: it failed some other way, e.g. an ImportError) or
``skip`` (could not be observed: no environment, INFRA, HANG). The older
endpoint's state holds up to the boundary, the newer endpoint's state from it on:
for a regression (good older, bad newer) the boundary is the first bad point, for a
fix (bad older, good newer) the first good one.

Skipped and other points are searched around; when they border the boundary the result is
ambiguous and names every point that could be it; either way the result names them. Bisection assumes the
history is monotonic; ``verify`` extra probes spread over the untested points catch
a history that is not, and the result says so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

from harness.records.bisect import AMBIGUOUS, ENDPOINT_UNUSABLE, ENDPOINTS_AGREE, FOUND, NON_MONOTONIC

P = TypeVar("P")
State = Literal["good", "bad", "skip", "other"]
#: States that say nothing about which side of the boundary a point is on.
UNKNOWN = ("skip", "other")


@dataclass(frozen=True)
class Probe(Generic[P]):
    point: P
    state: State
    role: str  # "endpoint", "bisect" or "verify"


@dataclass
class SearchResult(Generic[P]):
    status: str
    #: "regression" when the older endpoint is good, "fix" when it is bad.
    kind: str
    boundary: P | None = None
    #: Every point that could be the boundary (one when found, several when ambiguous).
    candidates: list[P] = field(default_factory=list)
    skipped: list[P] = field(default_factory=list)
    #: Points that were observed failing some other way than either endpoint.
    others: list[P] = field(default_factory=list)
    #: Probes that contradict a monotonic history.
    contradictions: list[Probe[P]] = field(default_factory=list)
    probes: list[Probe[P]] = field(default_factory=list)


def _closest_to_middle(indices: list[int], lo: int, hi: int) -> int:
    middle = (lo + hi) / 2
    return min(indices, key=lambda i: (abs(i - middle), i))


def _spread(indices: list[int], count: int) -> list[int]:
    if count <= 0 or not indices:
        return []
    if count >= len(indices):
        return list(indices)
    step = len(indices) / count
    return sorted({indices[int(step * k + step / 2)] for k in range(count)})


def search(points: Sequence[P], probe: Callable[[P, str], State], verify: int = 0) -> SearchResult[P]:
    """Probe both endpoints, then bisect between them. ``points`` are oldest first;
    ``probe(point, role)`` observes one point (role: endpoint, bisect or verify)."""
    if len(points) < 2:
        raise ValueError("need at least two points")
    probes: list[Probe[P]] = []
    states: dict[int, State] = {}

    def look(i: int, role: str) -> State:
        state = probe(points[i], role)
        states[i] = state
        probes.append(Probe(points[i], state, role))
        return state

    first, last = 0, len(points) - 1
    old_state, new_state = look(first, "endpoint"), look(last, "endpoint")
    kind = "regression" if old_state == "good" else "fix"
    if old_state in UNKNOWN or new_state in UNKNOWN:
        return SearchResult(ENDPOINT_UNUSABLE, kind, probes=probes)
    if old_state == new_state:
        return SearchResult(ENDPOINTS_AGREE, kind, probes=probes)

    lo, hi = first, last
    skipped: set[int] = set()
    while True:
        inner = [i for i in range(lo + 1, hi) if i not in skipped]
        if not inner:
            break
        mid = _closest_to_middle(inner, lo, hi)
        state = look(mid, "bisect")
        if state in UNKNOWN:
            skipped.add(mid)
        elif state == old_state:
            lo = mid
        else:
            hi = mid

    untested = [i for i in range(len(points)) if i not in states]
    for i in _spread(untested, verify):
        look(i, "verify")
    contradictions = [
        Probe(points[i], s, "")
        for i, s in sorted(states.items())
        if (i <= lo and s == new_state) or (i >= hi and s == old_state)
    ]
    contradictions = [next(p for p in probes if p.point == c.point) for c in contradictions]
    skipped_points = [points[i] for i in sorted(i for i, s in states.items() if s == "skip")]
    other_points = [points[i] for i in sorted(i for i, s in states.items() if s == "other")]
    bordering = [i for i in range(lo + 1, hi) if i in skipped]
    candidates = [points[i] for i in [*bordering, hi]]
    if contradictions:
        status = NON_MONOTONIC
    elif bordering:
        status = AMBIGUOUS
    else:
        status = FOUND
    return SearchResult(
        status=status,
        kind=kind,
        boundary=points[hi] if status == FOUND else None,
        candidates=candidates,
        skipped=skipped_points,
        others=other_points,
        contradictions=contradictions,
        probes=probes,
    )
