"""Which expectation a repro declares for a cell's resolved versions.

Consulted only after an outcome has been observed, to say whether it matched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from repros.runtime.outcomes import Outcome
from repros.runtime.spec import Expectation, ReproSpec


def holds(when: Mapping[str, str], versions: Mapping[str, str | None]) -> bool:
    for package, spec in when.items():
        installed = versions.get(canonicalize_name(package))
        if installed is None:
            return False
        try:
            if not SpecifierSet(spec, prereleases=True).contains(Version(installed)):
                return False
        except InvalidVersion:
            return False
    return True


def expectation_for(
    spec: ReproSpec,
    mode: str,
    versions: Mapping[str, str | None],
    device: str | None = None,
    world_size: int | None = None,
) -> Expectation | None:
    """The first expectation of ``mode`` whose version ranges all hold, whose device, if it names
    one, is the device the ranks ran on, and whose world sizes, if bounded, hold the item's."""
    return next(
        (
            e
            for e in spec.expectations
            if e.mode == mode
            and (e.device is None or e.device == device)
            and (e.world_sizes.unbounded or world_size in e.world_sizes)
            and holds(e.when, versions)
        ),
        None,
    )


#: What every crosscheck item is expected to observe unless a documented failure says otherwise.
CROSSCHECK_PREMISE = (
    "crosscheck's premise: every strategy trains what one process trains on the same global batch, up to the "
    "tolerance its precision and reduction order allow (docs/crosscheck.md)"
)


@dataclass(frozen=True)
class CrosscheckExpectation:
    """What a crosscheck item is expected to observe: AGREES, or DIVERGES by a documented failure (``spec``)."""

    expectation: Expectation
    spec: ReproSpec | None = None

    def names(self, signature: str | None) -> bool:
        """Whether ``signature`` is one of the expected failure's (any where none is expected)."""
        if self.spec is None:
            return True
        return signature is not None and any(s.id == signature for s in self.spec.signatures)


def crosscheck_expectation(
    strategy: str,
    known: Sequence[ReproSpec],
    versions: Mapping[str, str | None],
    device: str | None = None,
    world_size: int | None = None,
) -> CrosscheckExpectation:
    """DIVERGES where a documented failure says it makes the strategy diverge at these versions (on this device,
    within the failure's world sizes); else AGREES."""
    for spec in known:
        if world_size is not None and world_size not in spec.world_sizes:
            continue
        for where in spec.diverges:
            if not where.names(strategy) or (where.device is not None and where.device != device):
                continue
            if holds(where.when, versions):
                return CrosscheckExpectation(
                    Expectation(
                        "bug", Outcome.DIVERGES, where.when, where.established_by, note=spec.id, device=where.device
                    ),
                    spec,
                )
    return CrosscheckExpectation(Expectation("bug", Outcome.AGREES, {}, CROSSCHECK_PREMISE))
