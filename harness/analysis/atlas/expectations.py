"""The claims a repro's expectations make: each ``bug`` expectation's ``when`` range, under the stacks it was
established on (``Expectation.under``), with the command that established it as its evidence.

The range is taken as proven along the packages it names between the releases its command observed there
(``Expectation.observed``; none recorded: no release of them); every other package the failure depends on
(``ReproSpec.depends_on``) is held to a stack it was established on. An expectation that records no stack
proves nothing beyond its own packages: only runs' evidence can place it. A claim holds on the device its
command ran on (``Expectation.device``, else ``established_on``; neither: no device) and at the world sizes
both the expectation and the SPEC allow (the SPEC's are where the failure can occur at all).
"""

from __future__ import annotations

import re

from harness.analysis.atlas.model import Claim, Evidence
from harness.config.repros import Repro
from repros.runtime.spec import Expectation, WorldSizes

_DAY = re.compile(r"\b(\d{4}-\d{2}-\d{2})\b")


def day_in(text: str) -> str | None:
    """The first day a command's description names (``(2026-11-22, torch 2.13.0+cpu ...)``)."""
    found = _DAY.search(text)
    return found.group(1) if found else None


def _evidence(repro: Repro, expectation: Expectation) -> list[Evidence]:
    stacks = list(expectation.under) or [{}]
    return [
        Evidence(
            command=expectation.established_by or "(no command recorded)",
            date=day_in(expectation.established_by),
            versions={**{k: v for k, v in stack.items() if k not in expectation.when}, **expectation.when},
            outcome=str(expectation.outcome),
            source="catalog",
            where=repro.module,
            device=expectation.device or expectation.established_on,
            note=expectation.note,
        )
        for stack in stacks
    ]


def world_sizes_within(one: WorldSizes, other: WorldSizes) -> WorldSizes | None:
    """The world sizes both allow (None: none)."""
    low = max(one.minimum, other.minimum)
    highs = [m for m in (one.maximum, other.maximum) if m is not None]
    high = min(highs) if highs else None
    return None if high is not None and high < low else WorldSizes(low, high)


def catalog_claims(repro: Repro) -> list[Claim]:
    """The claims of the repro's ``bug`` expectations, in its order (one whose world sizes the SPEC rules out
    altogether claims nothing)."""
    claims = []
    for e in repro.spec.expectations:
        sizes = world_sizes_within(e.world_sizes, repro.spec.world_sizes)
        if e.mode != "bug" or sizes is None:
            continue
        claims.append(
            Claim(
                outcome=str(e.outcome),
                when=dict(e.when),
                observed={package: list(versions) for package, versions in e.observed.items()},
                under=[dict(stack) for stack in e.under],
                device=e.device or e.established_on,
                world_sizes=str(sizes),
                source="catalog",
                note=e.note,
                evidence=_evidence(repro, e),
            )
        )
    return claims
