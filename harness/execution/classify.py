"""Turn what the ranks recorded into one outcome of the vocabulary (``repros/runtime/outcomes.py``).

bug mode:   REPRODUCED | NOT_REPRODUCED | DIFFERENT_ERROR | INFRA | HANG | CRASH
            (the cell's stack failing, a package that does not import or one it lacks, is INFRA in
            both modes, unless a documented signature names that very error)
fixed mode: PASS | FAIL | INFRA | HANG | CRASH (PASS: trained by the fixed trainer's rule, or for a
            repro whose ``pass_rule`` is ``clean-exit``, a user's script that ran to its end)
crosscheck: AGREES | DIVERGES | INFRA | HANG | CRASH (DIVERGES where the strategy trained otherwise than
            one process, said by the rank, or raised anything but the stack's own failure; its signature
            names the documented failure that explains it, if one does)
A cell whose environment cannot be built gives UNRESOLVABLE (decided before any launch).

Only an observed signature makes REPRODUCED; only observed training facts make PASS.
Expectations play no part here.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from harness.core.json import JsonValue
from harness.execution.launchers.result import LaunchResult
from harness.records.rank import RankRecord
from repros.runtime import patterns
from repros.runtime.outcomes import Outcome
from repros.runtime.patterns import PatternRunaway
from repros.runtime.spec import ReproSpec

REPRODUCED = Outcome.REPRODUCED
NOT_REPRODUCED = Outcome.NOT_REPRODUCED
DIFFERENT_ERROR = Outcome.DIFFERENT_ERROR
PASS = Outcome.PASS
FAIL = Outcome.FAIL
INFRA = Outcome.INFRA
HANG = Outcome.HANG
CRASH = Outcome.CRASH

#: Exception types that say the machine, not the code under test, failed.
_INFRA_EXCEPTIONS = ("MemoryError", "torch.OutOfMemoryError", "torch.cuda.OutOfMemoryError")
#: Phases before the scenario itself runs: failing there is the harness's or the
#: environment's trouble (rendezvous, device, a repro module that does not import).
_INFRA_PHASES = ("setup", "import")
#: Signals torchrun itself sends to the surviving ranks when one has failed.
_LAUNCHER_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@dataclass(frozen=True)
class ErrorInfo:
    type: str
    message: str
    rank: int | None
    traceback: str | None = None
    #: What the type is a kind of (its base classes, qualified), where the rank said.
    bases: tuple[str, ...] = ()

    @property
    def first_line(self) -> str:
        return next((ln for ln in self.message.splitlines() if ln.strip()), "")


@dataclass(frozen=True)
class Observation:
    outcome: Outcome
    signature: str | None = None
    error: ErrorInfo | None = None
    #: Why a fixed run did not count as trained, or what the infrastructure said.
    reasons: tuple[str, ...] = field(default_factory=tuple)
    #: crosscheck: where the strategy first trained otherwise than one process.
    divergence: Mapping[str, JsonValue] | None = None


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def judge_training(records: Sequence[RankRecord]) -> list[str]:
    """Why the fixed trainer did not train, empty when it did: on every rank the loss
    fell, every adapter parameter got a finite non-zero gradient at some step and no
    non-finite one at any step, and every adapter weight moved."""
    problems: list[str] = []
    for rec in records:
        rank = rec.rank
        train = rec.train
        if train is None:
            problems.append(f"rank {rank}: recorded no training facts")
            continue
        losses = train.losses
        finite = [v for v in losses if isinstance(v, int | float)]
        if len(finite) < 2 or len(finite) != len(losses):
            problems.append(f"rank {rank}: losses not finite or too few: {losses}")
        elif not finite[-1] < finite[0]:
            problems.append(f"rank {rank}: loss did not decrease ({finite[0]:.4g} -> {finite[-1]:.4g})")
        norms = train.adapter_grad_norms
        if not norms:
            problems.append(f"rank {rank}: no adapter parameters")
        for name, values in norms.items():
            if any(isinstance(v, str) or (isinstance(v, float) and not math.isfinite(v)) for v in values):
                problems.append(f"rank {rank}: {name} got a non-finite gradient")
            elif not any(isinstance(v, (int, float)) and v > 0 for v in values):
                kind = "no gradient" if all(v is None for v in values) else "only zero gradients"
                problems.append(f"rank {rank}: {name} got {kind}")
        for name, delta in train.adapter_weight_delta.items():
            if not isinstance(delta, (int, float)) or not delta > 0:
                problems.append(f"rank {rank}: {name} did not change")
    return problems


def _unobserved(launch: LaunchResult) -> Observation | None:
    """What ended the item before anything could be judged: the machine (a full disk, the item's
    directory removed), a hang, a scenario the cell cannot run, a rank killed by a signal, a
    failure in setup or import. None when the ranks ran."""
    if launch.machine_reason:
        return Observation(INFRA, reasons=(launch.machine_reason,))
    if launch.timed_out:
        return Observation(HANG, reasons=(f"no end within the item's timeout; {_hung(launch)}",))

    unavailable = [(r, rec) for r, rec in sorted(launch.records.items()) if rec and rec.status == "unavailable"]
    if unavailable:
        rank, rec = unavailable[0]
        return Observation(INFRA, reasons=(f"rank {rank}: {rec.unavailable_reason}",))

    # A rank killed by a signal torchrun does not send itself (it stops surviving
    # ranks with SIGTERM after a failure): its peers' errors are consequences.
    killed = {r: c for r, c in launch.rank_exitcodes.items() if c < 0 and -c not in _LAUNCHER_SIGNALS}
    if killed:
        rank, code = sorted(killed.items())[0]
        return Observation(CRASH, reasons=(f"rank {rank} killed by {_signal_name(code)}",))

    for rank, info, rec in _errors(launch):
        if info.type in _INFRA_EXCEPTIONS or rec.phase in _INFRA_PHASES:
            return Observation(INFRA, error=info, reasons=(f"rank {rank} failed in {rec.phase}: {info.type}",))
    return None


def _hung(launch: LaunchResult) -> str:
    """Which ranks hung, each in the phase it was in when the time ran out (read then from its
    record by the launcher; the records read after the kill where it read none)."""
    hung = launch.hung or {
        r: rec.phase or "an unknown phase" for r, rec in launch.records.items() if rec and rec.status == "running"
    }
    if not hung:
        return "every rank had ended; the launcher had not"
    return "hung: " + ", ".join(f"rank {rank} in {phase}" for rank, phase in sorted(hung.items()))


def _errors(launch: LaunchResult) -> list[tuple[int, ErrorInfo, RankRecord]]:
    """The ranks that raised, with their error (a rank that says ``error`` but recorded none
    raised something it could not name)."""
    found = []
    for rank, rec in sorted(launch.records.items()):
        if rec is None or rec.status != "error":
            continue
        error = rec.error
        info = ErrorInfo(
            type=error.type if error else "UnknownError",
            message=error.message if error else "the rank recorded an error but not what it was",
            rank=rank,
            traceback=error.traceback if error else None,
            bases=tuple(error.bases) if error else (),
        )
        found.append((rank, info, rec))
    return found


def _ended_without_record(launch: LaunchResult) -> Observation | None:
    """No rank raised: a rank that never finished its record died some other way."""
    missing = [r for r, rec in launch.records.items() if rec is None]
    unfinished = [r for r, rec in launch.records.items() if rec is not None and rec.status == "running"]
    if len(missing) == launch.world_size:
        return Observation(INFRA, reasons=(f"no rank started (launcher exit {launch.returncode})",))
    if missing or unfinished or launch.returncode not in (0, None):
        return Observation(
            CRASH,
            reasons=(
                f"ranks ended without a final record (missing {missing}, unfinished {unfinished}); "
                f"launcher exit {launch.returncode}",
            ),
        )
    return None


class SignatureRunaway(Exception):
    """A signature's pattern ran away on a rank's message (``repros/runtime/patterns.py``)."""

    def __init__(self, signature: str, error: ErrorInfo, runaway: PatternRunaway) -> None:
        super().__init__(f"signature {signature}: {runaway}")
        self.signature = signature
        self.error = error

    def observation(self) -> Observation:
        """INFRA, saying it is the pattern: the script's error is kept, the script is not at fault."""
        reason = (
            f"{self}, on rank {self.error.rank}'s {self.error.type}; the item could not be classified: "
            "the signature's pattern is at fault, not the script (rewrite it without nested repeats)"
        )
        return Observation(INFRA, error=self.error, reasons=(reason,))


def matching_signature(
    specs: Sequence[ReproSpec], errors: list[tuple[int, ErrorInfo, RankRecord]]
) -> tuple[str, ErrorInfo] | None:
    """The first documented signature any rank's error matches, across ``specs`` in order;
    ``SignatureRunaway`` where a pattern backtracks without end on a message."""
    for spec in specs:
        for _, info, rec in errors:
            verdicts = rec.error.signature_verdicts if rec.error else {}
            for sig in spec.signatures:
                try:
                    if sig.matches(info.type, info.message, rec.scenario_facts, verdicts):
                        return sig.id, info
                except PatternRunaway as exc:
                    raise SignatureRunaway(sig.id, info, exc) from None
    return None


def _stack_failed(errors: list[tuple[int, ErrorInfo, RankRecord]]) -> Observation | None:
    """INFRA where a rank's error is the cell's stack failing (a package that does not import, one the
    cell lacks), with the rank's reason: never a classified outcome of the scenario."""
    for rank, info, rec in errors:
        reason = rec.error.stack_failure if rec.error else None
        if reason:
            return Observation(INFRA, error=info, reasons=(f"rank {rank}: {reason}",))
    return None


def _searched(pattern: str, message: str) -> bool:
    try:
        return bool(patterns.search(pattern, message))
    except PatternRunaway:
        return False


def different_error_hints(spec: ReproSpec, error: ErrorInfo) -> tuple[str, ...]:
    """Why an error is not the declared one, where a signature nearly matched: its message matched but
    the type was written otherwise (a base class of it, most often), or its type matched but not its
    message; or, where nothing came near, that the declared error never appeared."""
    hints = []
    raised = f"{error.type}: {error.first_line[:120]}"
    for sig in spec.signatures:
        declared = (sig.exception, *sig.aliases)
        if error.type in declared:
            if not _searched(sig.pattern, error.message):
                hints.append(
                    f"{error.type} was raised as {sig.id} declares, but its message does not match "
                    f"the pattern {sig.pattern!r}: {error.first_line[:120]}"
                )
        elif _searched(sig.pattern, error.message):
            kind = next((f"a subclass of the declared {d}" for d in declared if d in error.bases), None)
            hints.append(
                f"the message matches {sig.id}'s pattern, but the error is {error.type}"
                + (
                    f", {kind}: declare the type as the traceback prints it, {error.type}"
                    if kind
                    else f", not the declared {sig.exception}"
                )
            )
    if hints:
        return tuple(hints)
    declared_errors = " or ".join(f"{s.exception} matching {s.pattern!r}" for s in spec.signatures[:3])
    return (f"the declared error ({declared_errors}) never appeared: rank {error.rank} raised {raised}",)


def classify(mode: str, spec: ReproSpec, launch: LaunchResult) -> Observation:
    ended = _unobserved(launch)
    if ended is not None:
        return ended
    errors = _errors(launch)
    if errors:
        if mode == "bug":
            try:
                found = matching_signature([spec], errors)
            except SignatureRunaway as runaway:
                return runaway.observation()
            if found is not None:
                return Observation(REPRODUCED, signature=found[0], error=found[1])
        stack = _stack_failed(errors)
        if stack is not None:
            return stack
        if mode == "bug":
            return Observation(DIFFERENT_ERROR, error=errors[0][1], reasons=different_error_hints(spec, errors[0][1]))
        return Observation(FAIL, error=errors[0][1], reasons=(f"rank {errors[0][0]} raised {errors[0][1].type}",))
    ended = _ended_without_record(launch)
    if ended is not None:
        return ended
    if mode == "bug":
        return Observation(NOT_REPRODUCED)
    if spec.pass_rule == "clean-exit":
        # A user's script with its workaround: it ran to its end on every rank (it records no
        # training facts of the fixed trainer's to judge).
        return Observation(PASS, reasons=("every rank ran the script to its end",))
    if spec.pass_rule == "agrees":
        # Held against one process: a difference would have raised TrainsUnlikeOneProcess (FAIL above).
        return Observation(PASS, reasons=("trained what one process trains on the same global batch",))
    problems = judge_training([rec for rec in launch.records.values() if rec is not None])
    return Observation(PASS) if not problems else Observation(FAIL, reasons=tuple(problems))


#: Where the exceptions that name a silent symptom live (a repro raises them from its facts).
SILENT_FAILURE_MODULE = "repros.trainer.silent_failures."


def classify_scenario(own: ReproSpec | None, launch: LaunchResult, known: Sequence[ReproSpec]) -> Observation:
    """A scenario as users write it (a variant, a grid combination): PASS when it trained; a known
    failure when an error matches a documented signature (``own``'s first, then every other
    repro's); SILENT_FAILURE when it ran but did not train, or raised a silent symptom no
    signature names; NEW_FAILURE for any other error."""
    ended = _unobserved(launch)
    if ended is not None:
        return ended
    errors = _errors(launch)
    if errors:
        try:
            found = matching_signature([s for s in [own, *known] if s is not None], errors)
        except SignatureRunaway as runaway:
            return runaway.observation()
        if found is not None:
            return Observation(REPRODUCED, signature=found[0], error=found[1])
        stack = _stack_failed(errors)
        if stack is not None:
            return stack
        first = errors[0][1]
        if first.type.startswith(SILENT_FAILURE_MODULE):
            return Observation(Outcome.SILENT_FAILURE, error=first, reasons=(first.first_line,))
        return Observation(Outcome.NEW_FAILURE, error=first, reasons=(f"rank {errors[0][0]} raised {first.type}",))
    ended = _ended_without_record(launch)
    if ended is not None:
        return ended
    if own is not None and own.pass_rule == "clean-exit":
        # As ``classify``: a repro that records no fixed-trainer facts (F18 trains with TRL's own
        # trainer) passes by running to its end on every rank.
        return Observation(PASS, reasons=("every rank ran the script to its end",))
    problems = judge_training([rec for rec in launch.records.values() if rec is not None])
    return Observation(PASS) if not problems else Observation(Outcome.SILENT_FAILURE, reasons=tuple(problems))


#: The exception a crosscheck rank raises where its strategy trained otherwise than one process.
DIVERGENCE_EXCEPTION = SILENT_FAILURE_MODULE + "TrainsUnlikeOneProcess"


def classify_crosscheck(launch: LaunchResult, known: Sequence[ReproSpec]) -> Observation:
    """A strategy held against one process: AGREES where every rank ended and rank 0 found no difference
    beyond tolerance; DIVERGES where rank 0 found one (its divergence from the rank's facts) or a rank raised
    (the divergence is the error), named by the documented signature that matches, if any; the stack's own
    failure, a rank that could not run it, a hang or a crash as for any item."""
    ended = _unobserved(launch)
    if ended is not None:
        return ended
    errors = _errors(launch)
    if errors:
        try:
            found = matching_signature(known, errors)
        except SignatureRunaway as runaway:
            return runaway.observation()
        signature = found[0] if found is not None else None
        if found is None:
            stack = _stack_failed(errors)
            if stack is not None:
                return stack
        rank, first, rec = errors[0]
        facts = rec.crosscheck or {}
        recorded = facts.get("divergence") if first.type == DIVERGENCE_EXCEPTION else None
        divergence: Mapping[str, JsonValue] = (
            recorded
            if isinstance(recorded, dict)
            else {"step": None, "quantity": "error", "value": f"{first.type}: {first.first_line}"[:500]}
        )
        reason = first.first_line if first.type == DIVERGENCE_EXCEPTION else f"rank {rank} raised {first.type}"
        return Observation(Outcome.DIVERGES, signature=signature, error=first, reasons=(reason,), divergence=divergence)
    ended = _ended_without_record(launch)
    if ended is not None:
        return ended
    return Observation(Outcome.AGREES)
