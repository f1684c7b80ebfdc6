"""The outcome vocabulary, shared by both sides of the process boundary. Standard library only.

bug mode runs the documented configuration:
    REPRODUCED | NOT_REPRODUCED | DIFFERENT_ERROR | INFRA | HANG | CRASH
fixed mode runs the fixed trainer on the same scenario:
    PASS | FAIL | INFRA | HANG | CRASH
A scenario as users write it (a workaround variant of a repro, a combination of the config grid)
is run and classified against every repro's signatures:
    PASS | REPRODUCED (a known failure: the record's signature names it) | SILENT_FAILURE (ran but
    did not train, or what it saved does not load back the same) | NEW_FAILURE (any other error)
    | INFRA | HANG | CRASH
A crosscheck item (a training strategy held against one process training the same adapter) observes:
    AGREES | DIVERGES (it trained otherwise, or raised; the record's divergence says where, and its
    signature names the documented failure that explains it, if one does) | INFRA | HANG | CRASH
A cell whose environment cannot be resolved or installed gives UNRESOLVABLE for all its items.
An item run several times (``run --repeat N``) whose attempts did not all end the same way is
FLAKY, its attempts kept as the evidence: a verdict over attempts, never one attempt's outcome.

``Outcome`` is a ``StrEnum``: a member is its own name as a string, so records written as
JSON carry plain strings and a record read back compares equal to the member.
"""

from __future__ import annotations

from enum import StrEnum


class Outcome(StrEnum):
    REPRODUCED = "REPRODUCED"
    NOT_REPRODUCED = "NOT_REPRODUCED"
    DIFFERENT_ERROR = "DIFFERENT_ERROR"
    PASS = "PASS"
    FAIL = "FAIL"
    INFRA = "INFRA"
    HANG = "HANG"
    CRASH = "CRASH"
    UNRESOLVABLE = "UNRESOLVABLE"
    SILENT_FAILURE = "SILENT_FAILURE"
    NEW_FAILURE = "NEW_FAILURE"
    FLAKY = "FLAKY"
    AGREES = "AGREES"
    DIVERGES = "DIVERGES"


#: Outcomes either mode can end with: the item could not be observed, or ended without a verdict.
COMMON = (Outcome.INFRA, Outcome.HANG, Outcome.CRASH, Outcome.UNRESOLVABLE)
#: What each mode can observe.
BY_MODE: dict[str, tuple[Outcome, ...]] = {
    "bug": (Outcome.REPRODUCED, Outcome.NOT_REPRODUCED, Outcome.DIFFERENT_ERROR, *COMMON),
    "fixed": (Outcome.PASS, Outcome.FAIL, *COMMON),
}
#: What a scenario as users write it can observe (variants and grid combinations).
SCENARIO_OUTCOMES = (
    Outcome.PASS,
    Outcome.REPRODUCED,
    Outcome.SILENT_FAILURE,
    Outcome.NEW_FAILURE,
    *COMMON,
)
#: What a crosscheck item can observe.
CROSSCHECK_OUTCOMES = (Outcome.AGREES, Outcome.DIVERGES, *COMMON)
#: Outcomes where nothing was learnt about the code under test (the machine or the launch failed).
UNOBSERVED = (Outcome.INFRA, Outcome.HANG, Outcome.UNRESOLVABLE)
