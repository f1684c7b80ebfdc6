"""What ``ft-regress check`` says of a stack: per documented failure, whether this stack has it, has it
not, or cannot run it here (and why), and what the fixed trainer did and what its guards cost.

A failure is *had* where its ``bug`` item REPRODUCED: only an observed signature says so. An
expectation is never the answer; where the observation contradicts the one the catalog has for these
versions, the line says so (a regression, or a fix, that nobody has recorded yet).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.records.item import ItemRecord
from harness.records.run_meta import ExcludedItem
from harness.reports.figures import memory, steps
from harness.reports.guard_costs import GuardCost, guard_costs
from repros.runtime.outcomes import Outcome
from repros.runtime.spec import ReproSpec

#: What a ``bug`` outcome says of the stack.
HAS = "has it"
HAS_NOT = "does not have it"
CANNOT_RUN = "cannot run here"
UNCLEAR = "unclear"


@dataclass(frozen=True)
class FailureVerdict:
    repro: str
    verdict: str
    #: Why: the signature observed, the reason it could not run, what happened instead.
    why: str
    #: What the fixed trainer did on this stack, with its guards and what they cost.
    fixed: str = ""
    #: Where the observation contradicts the catalog's expectation for these versions.
    contradicts: str = ""

    def line(self) -> str:
        text = f"{self.repro:<4} {self.verdict}: {self.why}"
        if self.contradicts:
            text += f" [{self.contradicts}]"
        if self.fixed:
            text += f"; fixed trainer: {self.fixed}"
        return text


def _first_line(text: str, limit: int = 160) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _other_failure(record: ItemRecord, known: Sequence[ReproSpec]) -> str | None:
    """The signature of another documented failure the error matches (F13 stopping F9 first), if any."""
    error = record.error
    if error is None:
        return None
    for spec in known:
        if spec.id == record.repro:
            continue
        for sig in spec.signatures:
            if sig.declarative and sig.matches(error.type, error.message):
                return sig.id
    return None


def _bug_verdict(record: ItemRecord, known: Sequence[ReproSpec] = ()) -> tuple[str, str]:
    outcome = record.outcome
    error = record.error
    said = f"{error.type}: {_first_line(error.message)}" if error else ""
    if outcome == Outcome.REPRODUCED:
        return HAS, f"REPRODUCED {record.signature or ''}".rstrip() + (f" ({said})" if said else "")
    if outcome == Outcome.NOT_REPRODUCED:
        return HAS_NOT, "NOT_REPRODUCED: the documented configuration ran clean"
    if outcome in (Outcome.INFRA, Outcome.UNRESOLVABLE):
        reason = record.reasons[0] if record.reasons else said
        return CANNOT_RUN, f"{outcome}: {_first_line(reason)}"
    reason = said or (record.reasons[0] if record.reasons else "")
    other = _other_failure(record, known) if outcome == Outcome.DIFFERENT_ERROR else None
    if other is not None:
        return UNCLEAR, f"another documented failure came first: {other} ({_first_line(reason)})"
    return UNCLEAR, f"{outcome}" + (f": {_first_line(reason)}" if reason else "")


def _figures(record: ItemRecord) -> str:
    found = memory(record)
    timed = steps(record)
    parts = []
    if found is not None:
        parts.append(f"{found.what} {found.bytes / 2**20:.1f} MiB")
    if timed is not None:
        parts.append(f"{timed.summary.median * 1000:.0f} ms/step ({timed.what})")
    return ", ".join(parts)


def _cost(cost: GuardCost | None) -> str:
    if cost is None:
        return ""
    parts = []
    if cost.mem_delta is not None:
        parts.append(f"{cost.mem_delta / 2**20:+.1f} MiB")
    if cost.step_delta_s is not None:
        parts.append(f"{cost.step_delta_s * 1000:+.0f} ms/step")
    said = ", ".join(parts)
    if cost.note:
        said = f"{said} ({cost.note})" if said else cost.note
    return f"guards cost {said} against the unguarded run" if said else ""


def _fixed_verdict(record: ItemRecord | None, cost: GuardCost | None) -> str:
    if record is None:
        return ""
    guards = ", ".join(record.guard_ids) or "no guard"
    if record.outcome == Outcome.PASS:
        said = f"PASS with {guards}"
        figures = _figures(record)
        priced = _cost(cost)
        return "; ".join(filter(None, [said, figures, priced]))
    reason = record.reasons[0] if record.reasons else (record.error.message if record.error else "")
    return f"{record.outcome}" + (f": {_first_line(reason)}" if reason else "")


def _contradiction(record: ItemRecord) -> str:
    if record.matched or record.expected is None or record.outcome in (Outcome.INFRA, Outcome.UNRESOLVABLE):
        return ""
    return f"the catalog expects {record.expected} for these versions"


def check_verdicts(
    records: Sequence[ItemRecord], excluded: Sequence[ExcludedItem], known: Sequence[ReproSpec] = ()
) -> list[FailureVerdict]:
    """One verdict per documented failure the check planned, in the order of its ids (``known``: the
    documented failures, to name one that stopped another's scenario first)."""
    by_repro: dict[str, dict[str, ItemRecord]] = {}
    for record in records:
        by_repro.setdefault(record.repro, {})[record.mode] = record
    costs = {(c.cell, c.repro): c for c in guard_costs(records)[0]}
    verdicts: dict[str, FailureVerdict] = {}
    for repro, modes in by_repro.items():
        bug, fixed = modes.get("bug"), modes.get("fixed")
        cost = costs.get((fixed.cell, repro)) if fixed is not None else None
        if bug is not None:
            verdict, why = _bug_verdict(bug, known)
            contradicts = _contradiction(bug)
        else:
            verdict, why, contradicts = UNCLEAR, "its documented configuration did not run (fixed mode only)", ""
        verdicts[repro] = FailureVerdict(repro, verdict, why, _fixed_verdict(fixed, cost), contradicts)
    for item in excluded:
        if item.repro not in verdicts:
            verdicts[item.repro] = FailureVerdict(item.repro, CANNOT_RUN, f"excluded: {item.reason}")
    return [verdicts[k] for k in sorted(verdicts, key=_id_order)]


def _id_order(repro: str) -> tuple[str, int, str]:
    head = repro.rstrip("0123456789")
    digits = repro[len(head) :]
    return (head, int(digits) if digits else -1, repro)


def stack_has_a_failure(verdicts: Sequence[FailureVerdict]) -> bool:
    return any(v.verdict == HAS for v in verdicts)


def nothing_checked(verdicts: Sequence[FailureVerdict]) -> bool:
    """Whether no documented failure could run here (every one ``cannot run here``, or none planned): the check
    checked nothing, and must not pass."""
    return all(v.verdict == CANNOT_RUN for v in verdicts)


def conclusion(verdicts: Sequence[FailureVerdict], diverged: int = 0) -> str:
    """The last line: which documented failures the stack has, of how many could run here, and how many
    strategies train otherwise than one process (``crosscheck``)."""
    counts = {kind: [v.repro for v in verdicts if v.verdict == kind] for kind in (HAS, HAS_NOT, CANNOT_RUN, UNCLEAR)}
    if nothing_checked(verdicts) and not diverged:
        why = f" (the first, {verdicts[0].repro}: {verdicts[0].why})" if verdicts else ""
        return (
            f"nothing could be checked: none of the {len(verdicts)} documented failures selected could run here"
            f"{why}; install what they need into this interpreter, or run them where it is"
        )
    ran = len(counts[HAS]) + len(counts[HAS_NOT]) + len(counts[UNCLEAR])
    said = (
        f"this stack has {', '.join(counts[HAS])}"
        if counts[HAS]
        else f"this stack has none of the {ran} documented failures that could run here"
    )
    rest = [f"{len(counts[HAS_NOT])} it does not have"] if counts[HAS] and counts[HAS_NOT] else []
    if counts[UNCLEAR]:
        rest.append(f"{len(counts[UNCLEAR])} unclear ({', '.join(counts[UNCLEAR])})")
    if counts[CANNOT_RUN]:
        rest.append(f"{len(counts[CANNOT_RUN])} could not run here")
    if diverged:
        rest.append(f"{diverged} training strategies train otherwise than one process (crosscheck, above)")
    return said + (f"; {'; '.join(rest)}" if rest else "")
