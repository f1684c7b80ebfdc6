"""What a change of outcome means, from the two outcomes alone: the rules ``watch`` applies once a
change has held (reruns or a bisect's endpoints showed it again)."""

from __future__ import annotations

from harness.records.changes import CHANGED, FIXED_UPSTREAM, REGRESSED
from harness.records.item import ItemRecord
from repros.runtime.outcomes import UNOBSERVED, Outcome

#: What a trainer that trains shows: the fixed mode's PASS, the bug mode's NOT_REPRODUCED, a crosscheck
#: strategy's AGREES (it trains what one process trains).
TRAINS = (Outcome.PASS, Outcome.NOT_REPRODUCED, Outcome.AGREES)


def observed(record: ItemRecord) -> bool:
    return record.outcome not in UNOBSERVED and record.outcome != Outcome.FLAKY


def _how(record: ItemRecord) -> str:
    detail = record.signature or (record.error.type if record.error else None)
    return f"{record.outcome} ({detail})" if detail else str(record.outcome)


def verdict_of(before: ItemRecord, after: ItemRecord) -> tuple[str, str]:
    """The verdict and its reason for a change from ``before`` to ``after`` that held.

    ``fixed-upstream``: a documented failure stopped reproducing (bug mode REPRODUCED ->
    NOT_REPRODUCED). ``regressed``: what trained now fails (bug mode NOT_REPRODUCED -> REPRODUCED
    included: the documented failure is back), or a failure now fails differently (another
    signature, another exception). ``changed``: anything else (a failure that now trains in the
    fixed mode, an item that could not run one of the nights)."""
    was, now = _how(before), _how(after)
    if not observed(before) or not observed(after):
        return CHANGED, f"{was} -> {now}: one night did not observe the item, so nothing is judged"
    if after.mode == "bug" and before.outcome == Outcome.REPRODUCED and after.outcome == Outcome.NOT_REPRODUCED:
        return FIXED_UPSTREAM, f"the documented failure ({before.signature}) no longer reproduces"
    if before.outcome == Outcome.DIVERGES and after.outcome == Outcome.AGREES:
        what = f"the documented failure ({before.signature})" if before.signature else "the divergence"
        return FIXED_UPSTREAM, f"{what} is gone: the strategy trains what one process trains"
    if before.outcome in TRAINS and after.outcome not in TRAINS:
        return REGRESSED, f"it trained ({was}) and now fails: {now}"
    if before.outcome not in TRAINS and after.outcome not in TRAINS:
        return REGRESSED, f"it failed as {was} and now fails differently: {now}"
    return CHANGED, f"{was} -> {now}"
