"""``atlas check``: for every documented failure, whether a stack has it, from what was proven, running nothing.

A failure is ``affected`` where every claim the stack lies inside (and no run contradicted) says the failure is
there, ``not affected`` where every one says it is not, and ``unknown`` everywhere else: no claim holds the
stack (a package outside every stack the failure was proven under, or beyond the releases a range was observed
at, one the stack does not name), the claims disagree, one was contradicted by a later run, or what was seen
there was something else. A claim answers for the device its evidence ran on only: where the device is not
known, the stack is ``affected`` if it is on either, and ``not affected`` only if on both. A family the failure
cannot occur in (``impossible_in``), or a world size outside the SPEC's ``world_sizes``, is ``not affected``,
with the SPEC's why. An unknown line carries the command that would prove it.

Where affected, the line names the fixed trainer's guard and what it costs, as ``costs`` measured it.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.analysis.atlas.model import BAD, GOOD, OTHER, UNOBSERVED, AtlasFile, Claim, FailureEntry
from harness.analysis.atlas.regions import (
    Where,
    inside,
    is_pin,
    matching_stack,
    observed_text,
    outside,
    verdict_of,
)
from harness.analysis.explain.match import cost_lines, guard_lines
from harness.config.repros import Discovery
from harness.core.errors import EXIT_NOTHING_CHECKED
from harness.core.invocation import program_text
from harness.environments.stacks import Stack
from harness.records.costs import newest_costs, read_costs
from harness.reports.cost_table import CostEntry
from repros.runtime.families import FAMILIES
from repros.runtime.spec import FIXED_TRAINER, ReproSpec

AFFECTED, NOT_AFFECTED, UNKNOWN = "affected", "not affected", "unknown"
DEVICES = ("cpu", "cuda")
#: The longest command a line quotes as its evidence (the atlas page has each whole).
MAX_COMMAND = 160


@dataclass(frozen=True)
class Answer:
    failure: str
    verdict: str
    why: str
    #: Whether running it could settle it (an unknown nothing was observed about, or was contradicted); not
    #: where something else was proven there already.
    provable: bool = False

    def line(self) -> str:
        return f"{self.failure} {self.verdict}: {self.why}"


@dataclass(frozen=True)
class Decision:
    verdict: str
    claims: tuple[Claim, ...]
    why: str
    #: For an unknown: whether a run of the stack could settle it.
    provable: bool = True


def where_of(stack: Stack, device: str | None, world_size: int | None, family: str | None) -> Where:
    versions: dict[str, str | None] = dict(stack.versions)
    return Where(
        versions=versions,
        complete=stack.complete,
        device=device,
        world_size=world_size,
        family=family,
    )


def _short(command: str) -> str:
    return command if len(command) <= MAX_COMMAND else command[: MAX_COMMAND - 2].rstrip() + " …"


def _evidence_text(claim: Claim) -> str:
    if not claim.evidence:
        return claim.source
    e = min(claim.evidence, key=lambda x: len(x.command))
    when = f" {e.date}" if e.date else ""
    return f"[{e.source}{when}: {_short(e.command)}]"


def _claim_text(claim: Claim, where: Where, depends_on: Sequence[str]) -> str:
    """Why the stack lies inside ``claim``: its range, the stack it was proven under, its evidence."""
    if claim.source == "run":
        scope = ", ".join(str(x) for x in (claim.device, f"{claim.world_sizes.lstrip('=')} ranks", claim.family) if x)
        return f"{claim.outcome} observed on this stack ({scope}) {_evidence_text(claim)}"
    ranges = ", ".join(
        f"{p}{s}" if is_pin(s) else f"{p} {where.version(p)} in {s} (observed {observed_text(claim, p)})"
        for p, s in claim.when.items()
    )
    held = [p for p in depends_on if p not in claim.when]
    stack = matching_stack(claim, where, depends_on) or {}
    pins = ", ".join(f"{p}{stack[p]}" for p in held if p in stack)
    place = f"where {ranges}" + (f" under {pins}" if pins else "") if ranges else f"on {pins or 'every stack'}"
    device = f" on {claim.device}" if claim.device else ""
    return f"{claim.outcome} {place}{device} {_evidence_text(claim)}"


def _nearest(claims: Sequence[Claim], where: Where, depends_on: Sequence[str]) -> str:
    """Why no claim holds the stack, told by the claim it misses least."""
    ranked = sorted(
        (c for c in claims if c.source != "run" and verdict_of(c.outcome) in (BAD, GOOD)),
        # The claim missed by fewest reasons, one whose range as written holds the stack first.
        key=lambda c: (len(outside(c, where, depends_on)), len(outside(c, where, depends_on, spans=False))),
    )
    if not ranked:
        ranked = [c for c in claims if c.source != "run"] or list(claims)
    if not ranked:
        return "nothing was proven about it yet"
    best = ranked[0]
    ranges = ", ".join(f"{p}{s}" for p, s in best.when.items()) or "every release measured"
    missed = "; ".join(outside(best, where, depends_on))
    return f"outside every proven range ({missed}; nearest: {best.outcome} where {ranges})"


def decide(claims: Sequence[Claim], where: Where, depends_on: Sequence[str]) -> Decision:
    """The answer for one place (its device known or not)."""
    applicable = [c for c in claims if inside(c, where, depends_on)]
    trusted = [c for c in applicable if not c.contradicted]
    verdicts = {verdict_of(c.outcome) for c in trusted} - {UNOBSERVED}
    if verdicts == {BAD}:
        return Decision(AFFECTED, tuple(c for c in trusted if verdict_of(c.outcome) == BAD), "")
    if verdicts == {GOOD}:
        return Decision(NOT_AFFECTED, tuple(c for c in trusted if verdict_of(c.outcome) == GOOD), "")
    if BAD in verdicts and GOOD in verdicts:
        said = "; ".join(_claim_text(c, where, depends_on) for c in trusted)
        return Decision(UNKNOWN, tuple(trusted), f"the proofs disagree: {said}")
    if trusted:
        seen = [c for c in trusted if verdict_of(c.outcome) == OTHER] or trusted
        said = "; ".join(_claim_text(c, where, depends_on) + (f" ({c.note})" if c.note else "") for c in seen)
        if not verdicts:  # only INFRA: the failure cannot run there (CUDA-only on a CPU, a stack that does not import)
            return Decision(UNKNOWN, tuple(seen), f"it cannot run here: {said}", provable=False)
        return Decision(UNKNOWN, tuple(seen), f"another outcome was proven here: {said}", provable=False)
    if applicable:
        against = applicable[0].contradicted_by[0]
        return Decision(
            UNKNOWN,
            tuple(applicable),
            f"{_claim_text(applicable[0], where, depends_on)} was contradicted by {against.source} "
            f"{against.date or ''}: {against.outcome} ({_short(against.command)})",
        )
    return Decision(UNKNOWN, (), _nearest(claims, where, depends_on))


def _families(spec: ReproSpec) -> str:
    possible = [f for f in FAMILIES if f not in spec.impossible_in]
    return f" (in {', '.join(possible)} models only)" if spec.impossible_in and possible else ""


def _guard_and_cost(spec: ReproSpec, entry: FailureEntry, where: Where, costs: Sequence[CostEntry]) -> str:
    versions = {k: v for k, v in where.versions.items() if v is not None}
    guards = guard_lines(spec.id, versions)
    guard = guards[0] if guards else "no guard of the fixed trainer works around it"
    mine = [e for e in costs if e.repro == spec.id]
    measured = [line for line in (entry.costs or cost_lines(spec, mine)) if line.startswith(FIXED_TRAINER + ":")]
    cost = (
        measured[0].split(" - ", 1)[-1]
        if measured and not measured[0].endswith("not measured")
        else f"not measured yet ({program_text()} costs --repros {spec.id})"
    )
    return f"{guard}; it costs: {cost}"


def answer(spec: ReproSpec, entry: FailureEntry, where: Where, prove: str, costs: Sequence[CostEntry] = ()) -> Answer:
    """The line for one failure."""
    depends = list(entry.depends_on)
    if where.family is not None and where.family in spec.impossible_in:
        return Answer(spec.id, NOT_AFFECTED, f"it cannot occur in {where.family}: {spec.impossible_in[where.family]}")
    if where.world_size is not None and where.world_size not in spec.world_sizes:
        return Answer(
            spec.id,
            NOT_AFFECTED,
            f"it cannot occur at world size {where.world_size} (only {spec.world_sizes}): {spec.world_sizes_why}",
        )
    if where.device is not None:
        decision = decide(entry.claims, where, depends)
        suffix = ""
    else:
        by_device = {d: decide(entry.claims, dataclasses.replace(where, device=d), depends) for d in DEVICES}
        verdicts = {d.verdict for d in by_device.values()}
        decision, suffix = by_device[DEVICES[0]], ""
        if verdicts == {UNKNOWN} and not any(found.claims for found in by_device.values()):
            decision = Decision(UNKNOWN, (), _nearest(entry.claims, where, depends))
        elif verdicts == {UNKNOWN}:
            # Something was proven on one device only (a CUDA-only failure's INFRA on a CPU): what, and where not.
            shown = next(d for d, found in by_device.items() if found.claims)
            bare = [d for d, found in by_device.items() if not found.claims]
            decision = by_device[shown]
            if bare:
                suffix = f" (on {shown}; on {', '.join(bare)}: nothing proven; --device asks for one)"
        if len(verdicts) > 1:
            hit = [d for d, found in by_device.items() if found.verdict == AFFECTED]
            first = hit[0] if hit else next(d for d, found in by_device.items() if found.verdict == NOT_AFFECTED)
            others = "; ".join(f"on {d}: {found.verdict}" for d, found in by_device.items() if d != first)
            if hit:
                decision, suffix = by_device[first], f" (on {first}; {others}; --device asks for one)"
            else:
                unproven = next(found for found in by_device.values() if found.verdict == UNKNOWN)
                why = f"not affected on {first} only ({others}: {unproven.why}); --device asks for one"
                decision = Decision(UNKNOWN, by_device[first].claims, why)
    depends_text = ", ".join(depends)
    if decision.verdict == AFFECTED:
        said = "; ".join(_claim_text(c, where, depends) for c in decision.claims[:2])
        return Answer(
            spec.id,
            AFFECTED,
            f"{said}{suffix}{_families(spec)} | guard: {_guard_and_cost(spec, entry, where, costs)}",
        )
    if decision.verdict == NOT_AFFECTED:
        said = "; ".join(_claim_text(c, where, depends) for c in decision.claims[:2])
        return Answer(spec.id, NOT_AFFECTED, f"{said}{suffix}")
    if not decision.provable:
        return Answer(spec.id, UNKNOWN, f"{decision.why}{suffix}")
    return Answer(
        spec.id,
        UNKNOWN,
        f"{decision.why}{suffix}; decided by {depends_text} | prove it: {prove} --repros {spec.id}",
        provable=True,
    )


def prove_command(source: str) -> str:
    return f"{program_text()} atlas check {source} --prove"


def stack_argument(stack: Stack) -> str:
    """How the stack was given, as the command line takes it back."""
    if stack.source == "--stack":
        return f"--stack {shlex.quote(stack.text())}"
    if stack.source.startswith("the running interpreter"):
        return "--here"
    if not Path(stack.source).is_file():  # a surveyed stack ("survey.yaml trl-2514"): its releases as they are
        return f"--stack {shlex.quote(stack.text())}"
    return f"--requirements {shlex.quote(stack.source)}"


def check_stack(
    atlas: AtlasFile,
    discovery: Discovery,
    stack: Stack,
    where: Where,
    repros: Sequence[str] = (),
    reports_dir: Path = Path("reports"),
) -> list[Answer]:
    """One answer per failure of the atlas (or of ``repros``), in the catalog's order."""
    costs: list[CostEntry] = []
    if not any(f.costs for f in atlas.failures):
        newest = newest_costs(reports_dir)
        costs = read_costs(newest) if newest is not None else []
    prove = prove_command(stack_argument(stack))
    answers = []
    for entry in atlas.failures:
        if repros and entry.id not in repros:
            continue
        repro = discovery.repros.get(entry.id)
        if repro is None:
            continue
        answers.append(answer(repro.spec, entry, where, prove, costs))
    return answers


def nothing_answered(answers: Sequence[Answer]) -> bool:
    """Whether every failure asked about is unknown: the check answered nothing, and must not pass."""
    return bool(answers) and all(a.verdict == UNKNOWN for a in answers)


def exit_status(answers: Sequence[Answer]) -> int:
    """1 when a failure is affected; ``EXIT_NOTHING_CHECKED`` when every one is unknown; else 0."""
    if any(a.verdict == AFFECTED for a in answers):
        return 1
    return EXIT_NOTHING_CHECKED if nothing_answered(answers) else 0
