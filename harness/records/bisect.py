"""``bisect.json``: what a bisect found (``BisectReport``), the boundary or why there is none, with
every step it took (``Step``). ``bisect`` writes it (``harness/workflows/bisect``); ``watch`` and
the atlas read it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from harness.records.item import ErrorSummary
from repros.runtime.outcomes import Outcome

BISECT_FILE = "bisect.json"

#: A bisect's status: a boundary found, or why there is none.
FOUND = "found"
AMBIGUOUS = "ambiguous"
ENDPOINTS_AGREE = "endpoints-agree"
ENDPOINT_UNUSABLE = "endpoint-unusable"
NON_MONOTONIC = "non-monotonic"


class Step(BaseModel):
    """One step of a bisect, as ``bisect.json`` lists it."""

    model_config = ConfigDict(frozen=True)

    n: int
    role: str
    point: str
    outcome: Outcome
    signature: str | None
    #: good, bad, other (failed some other way) or skip (nothing observed).
    state: str
    seconds: float
    environment: str
    env_key: str | None
    error: ErrorSummary | None


class BisectReport(BaseModel):
    """What a bisect found (``bisect.json``): the boundary, or why there is none, with every step."""

    model_config = ConfigDict(frozen=True, extra="allow")

    run_id: str
    repro: str
    mode: str
    #: The matrix cell whose other packages every step holds.
    base_cell: str | None = None
    axis: str
    package: str | None
    good: str
    bad: str
    points: list[str]
    #: regression (good older, bad newer) or fix (bad older, good newer).
    kind: str
    #: found, ambiguous, non-monotonic, endpoints-agree or endpoint-unusable.
    status: str
    boundary: str | None
    candidates: list[str]
    skipped: list[str]
    failed_differently: list[str]
    #: With ``--by-date``: the packages that moved on the day found, (before, after), and each day
    #: resolved: the base cell's packages -> version.
    moved_on_boundary: dict[str, tuple[str | None, str | None]] = {}
    resolutions: dict[str, dict[str, str]] | None = None
    #: With ``--by-date``: each day resolved, every package (``name==version`` lines).
    locks: dict[str, list[str]] | None = None
    steps: list[Step]
    environments_built: int
    wall_s: float
    final: str
    directory: str

    def before_boundary(self) -> str | None:
        """The point just before the boundary: the last with the older endpoint's outcome."""
        if self.boundary is None or self.boundary not in self.points:
            return None
        i = self.points.index(self.boundary)
        return self.points[i - 1] if i > 0 else None
