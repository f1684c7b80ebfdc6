"""The claims a repro's expectations make: each ``bug`` expectation's ``when`` range, under the stacks it was
established on (``Expectation.under``), with the command that established it as its evidence.

The range is taken as proven along the packages it names (its command bisected or ran them); every other
package the failure depends on (``ReproSpec.depends_on``) is held to a stack it was established on. An
expectation that records no stack proves nothing beyond its own packages: only runs' evidence can place it.
"""

from __future__ import annotations

import re

from harness.analysis.atlas.model import Claim, Evidence
from harness.config.repros import Repro
from repros.runtime.spec import Expectation

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
            device=expectation.device,
            note=expectation.note,
        )
        for stack in stacks
    ]


def catalog_claims(repro: Repro) -> list[Claim]:
    """The claims of the repro's ``bug`` expectations, in its order."""
    return [
        Claim(
            outcome=str(e.outcome),
            when=dict(e.when),
            under=[dict(stack) for stack in e.under],
            device=e.device,
            world_sizes=str(e.world_sizes),
            source="catalog",
            note=e.note,
            evidence=_evidence(repro, e),
        )
        for e in repro.spec.expectations
        if e.mode == "bug"
    ]
