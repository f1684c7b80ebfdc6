"""What a repro declares about itself: standard library only.

Both sides of the process boundary read these objects. The orchestrator imports a
repro module to read its ``SPEC`` (so a repro module must keep its heavy imports
inside functions); the worker imports the same module to run it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: Modes a repro can run in. ``bug`` runs the documented configuration, ``fixed``
#: runs the fixed trainer on the same scenario.
MODES = ("bug", "fixed")

#: A check on the full text of an exception message; True when the text shows
#: the documented symptom.
MessageCheck = Callable[[str], bool]
#: A check on the facts the failing rank recorded about its scenario (``scenario_facts``
#: in its record, e.g. how many parameters were trainable); True when they fit the failure. It
#: tells apart failures that raise the same text for different reasons.
FactsCheck = Callable[[Mapping[str, Any]], bool]


@dataclass(frozen=True)
class Signature:
    """How a documented failure shows itself.

    ``exception`` is the fully qualified type name the rank recorded (its module
    plus qualified name); ``aliases`` lists other names the same class is known by
    in other library versions. ``pattern`` is a regular expression searched in the
    message; every one of ``checks`` must also hold for the signature to count, and
    every one of ``facts_checks`` on the scenario facts the failing rank recorded.
    """

    id: str
    exception: str
    pattern: str
    checks: tuple[MessageCheck, ...] = ()
    aliases: tuple[str, ...] = ()
    description: str = ""
    facts_checks: tuple[FactsCheck, ...] = ()

    def matches(self, exception_type: str, message: str, facts: Mapping[str, Any] | None = None) -> bool:
        if exception_type != self.exception and exception_type not in self.aliases:
            return False
        if not re.search(self.pattern, message, flags=re.MULTILINE):
            return False
        if not all(check(message) for check in self.checks):
            return False
        return all(check(facts or {}) for check in self.facts_checks)


@dataclass(frozen=True)
class Expectation:
    """What a mode is expected to observe where ``when`` holds.

    ``when`` maps package names to PEP 440 specifier strings that the cell's
    resolved versions must all satisfy (an empty mapping holds everywhere).
    ``established_by`` is the command whose run established the range. The first
    expectation of a mode that holds is the one used. Expectations are only
    compared with observations after the fact; they never decide an outcome.
    """

    mode: str
    outcome: str
    when: Mapping[str, str] = field(default_factory=dict)
    established_by: str = ""
    note: str = ""


@dataclass(frozen=True)
class ReproSpec:
    id: str
    title: str
    upstream: tuple[str, ...]
    signatures: tuple[Signature, ...]
    expectations: tuple[Expectation, ...]
    modes: tuple[str, ...] = MODES
    #: Ranks to launch; ``None`` takes the cell's world size.
    world_size: int | None = None
    #: Steps the scenario trains for, the first ``warmup_steps`` not timed.
    steps: int = 5
    warmup_steps: int = 1
    description: str = ""

    def __post_init__(self) -> None:
        unknown = [m for m in self.modes if m not in MODES]
        if unknown:
            raise ValueError(f"{self.id}: unknown modes {unknown}; known: {MODES}")
        for exp in self.expectations:
            if exp.mode not in self.modes:
                raise ValueError(f"{self.id}: expectation for mode {exp.mode!r} it does not run")
        if self.steps <= self.warmup_steps:
            raise ValueError(f"{self.id}: steps must exceed warmup_steps")

    def signature(self, signature_id: str) -> Signature | None:
        return next((s for s in self.signatures if s.id == signature_id), None)
