"""One classifier: an item's outcome (``repros/runtime/outcomes.py``), decided from what was observed of it.

Whatever the item (a repro in ``bug`` or ``fixed`` mode, a scenario as users write it: a costs variant or a grid
combination, a crosscheck strategy), ``classify`` runs one decision tree: the named steps of ``STEPS``, in order;
the first that answers decides. What differs by the kind of item is only what a step answers:

===================  ==========================================================================================
step                 answers
===================  ==========================================================================================
no environment       UNRESOLVABLE: the cell has no environment (nothing launched)
not started          INFRA: nothing could be launched (the interpreter gone, the node lost, the repro's file)
attempts             ``--repeat``: the outcome every attempt had, or FLAKY where they disagree
damaged environment  INFRA: the cell's environment changed while the item ran (the ranks' error kept beside)
the machine          INFRA: a full disk, the item's directory removed
hang                 HANG: no end within the item's timeout, naming each hung rank's phase
unavailable          INFRA: a rank said the scenario cannot run in this cell
killed               CRASH: a rank killed by a signal torchrun does not send itself
setup or import      INFRA: a rank failed before the scenario ran, or ran out of memory
signature            a documented signature names a rank's error: REPRODUCED (bug: the repro's own; a scenario:
                     its own, then every repro's), DIVERGES named by it (crosscheck); never in fixed mode
stack failure        INFRA: the cell's stack failing (a package that does not import, one the cell lacks)
raised               DIFFERENT_ERROR (bug), FAIL (fixed), SILENT_FAILURE or NEW_FAILURE (a scenario),
                     DIVERGES (crosscheck)
no final record      INFRA where no rank started, else CRASH
ran to its end       NOT_REPRODUCED (bug); PASS or FAIL by the pass rule (fixed); PASS or SILENT_FAILURE by
                     the training rule (a scenario); AGREES (crosscheck)
===================  ==========================================================================================

A rank records facts, never an outcome: its error (and whether it is the stack failing:
``repros/runtime/stack_failure.py``), what its repro's own signature checks said, that its scenario
cannot run here. Only an observed signature makes REPRODUCED; only observed training facts make
PASS. Expectations play no part here (but for which outcome a FLAKY item's attempts had most).
"""

from __future__ import annotations

import math
import signal
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

from harness.core.json import JsonValue
from harness.execution.launchers.result import LaunchResult
from harness.records.item import counts_text
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

#: What is classified: a repro in one of its modes, a scenario as users write it, a crosscheck strategy
#: (``PlannedItem.judged_as``).
KINDS = ("bug", "fixed", "scenario", "crosscheck")

#: Exception types that say the machine, not the code under test, failed.
_INFRA_EXCEPTIONS = ("MemoryError", "torch.OutOfMemoryError", "torch.cuda.OutOfMemoryError")
#: Phases before the scenario itself runs: failing there is the harness's or the
#: environment's trouble (rendezvous, device, a repro module that does not import).
_INFRA_PHASES = ("setup", "import")
#: Signals torchrun itself sends to the surviving ranks when one has failed.
_LAUNCHER_SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: Where the exceptions that name a silent symptom live (a repro raises them from its facts).
SILENT_FAILURE_MODULE = "repros.trainer.silent_failures."
#: The exception a crosscheck rank raises where its strategy trained otherwise than one process.
DIVERGENCE_EXCEPTION = SILENT_FAILURE_MODULE + "TrainsUnlikeOneProcess"


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


#: A rank that raised: its rank, its error, its record.
Raised = tuple[int, ErrorInfo, RankRecord]


@dataclass(frozen=True)
class Evidence:
    """What an outcome is decided from: what the item is, and what was observed of it."""

    kind: str
    #: The item's own repro (None: a grid combination, a crosscheck strategy).
    own: ReproSpec | None
    #: Every documented failure a scenario's or a strategy's error is held against.
    known: Sequence[ReproSpec] = ()
    launch: LaunchResult | None = None
    #: Why the item's cell has no environment.
    no_environment: str | None = None
    #: Why nothing of the item could be launched.
    not_started: str | None = None
    #: What changed in the cell's environment while the item ran.
    damage: str | None = None
    #: ``--repeat``: every attempt's outcome, in order; and the expected outcome (a tie goes to it).
    attempts: tuple[str, ...] = ()
    expected: str | None = None

    @cached_property
    def errors(self) -> list[Raised]:
        """The ranks that raised, with their error (a rank that says ``error`` but recorded none
        raised something it could not name)."""
        found = []
        for rank, rec in sorted(self.launch.records.items()) if self.launch is not None else ():
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

    @property
    def ranks(self) -> list[RankRecord]:
        """Every rank's record, where it wrote one."""
        return [rec for rec in self.launch.records.values() if rec is not None] if self.launch is not None else []


@dataclass(frozen=True)
class Step:
    """One step of the decision tree: its name, and what it answers (None: the next step decides)."""

    name: str
    decide: Callable[[Evidence], Observation | None]


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


def matching_signature(specs: Sequence[ReproSpec], errors: list[Raised]) -> tuple[str, ErrorInfo] | None:
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


# --- the steps, in the order ``STEPS`` runs them ---------------------------------------------------------------


def _no_environment(ev: Evidence) -> Observation | None:
    return Observation(Outcome.UNRESOLVABLE, reasons=(ev.no_environment,)) if ev.no_environment else None


def _not_started(ev: Evidence) -> Observation | None:
    return Observation(INFRA, reasons=(ev.not_started,)) if ev.not_started else None


def _attempts(ev: Evidence) -> Observation | None:
    """``--repeat``: the outcome every attempt had; FLAKY (never silently the last one) where they did not
    all end the same way, saying the counts and which attempts differed from the usual outcome."""
    if not ev.attempts:
        return None
    counts = dict(Counter(ev.attempts))
    if len(counts) == 1:
        return Observation(Outcome(ev.attempts[0]))
    usual = max(counts, key=lambda outcome: (counts[outcome], outcome == ev.expected))
    odd = [str(i) for i, outcome in enumerate(ev.attempts, 1) if outcome != usual]
    return Observation(
        Outcome.FLAKY, reasons=(f"attempts disagree: {counts_text(counts)} (attempts {', '.join(odd)} not {usual})",)
    )


def _damaged_environment(ev: Evidence) -> Observation | None:
    """INFRA, naming what changed: never a classified outcome. The error the ranks' steps name is kept."""
    if ev.damage is None:
        return None
    said = _first_answer(RANK_STEPS, ev)
    return Observation(INFRA, error=said.error if said is not None else None, reasons=(ev.damage,))


def _machine(ev: Evidence) -> Observation | None:
    reason = ev.launch.machine_reason if ev.launch is not None else None
    return Observation(INFRA, reasons=(reason,)) if reason else None


def _hang(ev: Evidence) -> Observation | None:
    if ev.launch is None or not ev.launch.timed_out:
        return None
    return Observation(HANG, reasons=(f"no end within the item's timeout; {_hung(ev.launch)}",))


def _hung(launch: LaunchResult) -> str:
    """Which ranks hung, each in the phase it was in when the time ran out (read then from its
    record by the launcher; the records read after the kill where it read none)."""
    hung = launch.hung or {
        r: rec.phase or "an unknown phase" for r, rec in launch.records.items() if rec and rec.status == "running"
    }
    if not hung:
        return "every rank had ended; the launcher had not"
    return "hung: " + ", ".join(f"rank {rank} in {phase}" for rank, phase in sorted(hung.items()))


def _unavailable(ev: Evidence) -> Observation | None:
    records = ev.launch.records if ev.launch is not None else {}
    unavailable = [(r, rec) for r, rec in sorted(records.items()) if rec and rec.status == "unavailable"]
    if not unavailable:
        return None
    rank, rec = unavailable[0]
    return Observation(INFRA, reasons=(f"rank {rank}: {rec.unavailable_reason}",))


def _killed(ev: Evidence) -> Observation | None:
    """A rank killed by a signal torchrun does not send itself (it stops surviving ranks with SIGTERM
    after a failure): its peers' errors are consequences."""
    codes = ev.launch.rank_exitcodes if ev.launch is not None else {}
    killed = {r: c for r, c in codes.items() if c < 0 and -c not in _LAUNCHER_SIGNALS}
    if not killed:
        return None
    rank, code = sorted(killed.items())[0]
    return Observation(CRASH, reasons=(f"rank {rank} killed by {_signal_name(code)}",))


def _setup_or_import(ev: Evidence) -> Observation | None:
    for rank, info, rec in ev.errors:
        if info.type in _INFRA_EXCEPTIONS or rec.phase in _INFRA_PHASES:
            return Observation(INFRA, error=info, reasons=(f"rank {rank} failed in {rec.phase}: {info.type}",))
    return None


def _signature(ev: Evidence) -> Observation | None:
    """Whose signatures a kind holds its error against: bug, the repro's own; a scenario, its own then
    every documented one; a strategy, every documented one (naming its divergence); fixed, none."""
    whose: dict[str, list[ReproSpec | None]] = {
        "bug": [ev.own],
        "fixed": [],
        "scenario": [ev.own, *ev.known],
        "crosscheck": list(ev.known),
    }
    searched = whose[ev.kind]
    if not ev.errors:
        return None
    try:
        found = matching_signature([s for s in searched if s is not None], ev.errors)
    except SignatureRunaway as runaway:
        return runaway.observation()
    if found is None:
        return None
    if ev.kind == "crosscheck":
        return _diverges(ev, signature=found[0])
    return Observation(REPRODUCED, signature=found[0], error=found[1])


def _stack_failure(ev: Evidence) -> Observation | None:
    """The cell's stack failing (a package that does not import, one the cell lacks), with the rank's
    reason: never a classified outcome of the scenario."""
    for rank, info, rec in ev.errors:
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


def naming_a_divergence(expected: ReproSpec | None, known: Sequence[ReproSpec]) -> list[ReproSpec]:
    """The documented failures that may name a crosscheck strategy's divergence: the one expected to cause it
    here (its ``diverges`` covers the strategy at these versions) first; every other only by an error it
    raises, never by a difference found, since a failure's divergence signature reads the strategy's name alone
    and a divergence no failure is expected to cause here is a finding, not that failure's."""
    others = [
        replace(spec, signatures=tuple(sig for sig in spec.signatures if sig.exception != DIVERGENCE_EXCEPTION))
        for spec in known
        if spec is not expected
    ]
    return [expected, *others] if expected is not None else others


def _raised(ev: Evidence) -> Observation | None:
    if not ev.errors:
        return None
    rank, first, _ = ev.errors[0]
    if ev.kind == "bug":
        hints = different_error_hints(ev.own, first) if ev.own is not None else ()
        return Observation(DIFFERENT_ERROR, error=first, reasons=hints)
    if ev.kind == "fixed":
        return Observation(FAIL, error=first, reasons=(f"rank {rank} raised {first.type}",))
    if ev.kind == "crosscheck":
        return _diverges(ev, signature=None)
    if first.type.startswith(SILENT_FAILURE_MODULE):
        return Observation(Outcome.SILENT_FAILURE, error=first, reasons=(first.first_line,))
    return Observation(Outcome.NEW_FAILURE, error=first, reasons=(f"rank {rank} raised {first.type}",))


def _diverges(ev: Evidence, signature: str | None) -> Observation:
    """A strategy that raised: DIVERGES, where rank 0 recorded it found a difference (the divergence as it
    recorded it) or any error (the divergence is the error), named by ``signature`` where one matched."""
    rank, first, rec = ev.errors[0]
    facts = rec.crosscheck or {}
    recorded = facts.get("divergence") if first.type == DIVERGENCE_EXCEPTION else None
    divergence: Mapping[str, JsonValue] = (
        recorded
        if isinstance(recorded, dict)
        else {"step": None, "quantity": "error", "value": f"{first.type}: {first.first_line}"[:500]}
    )
    reason = first.first_line if first.type == DIVERGENCE_EXCEPTION else f"rank {rank} raised {first.type}"
    return Observation(Outcome.DIVERGES, signature=signature, error=first, reasons=(reason,), divergence=divergence)


def _no_final_record(ev: Evidence) -> Observation | None:
    """No rank raised: a rank that never finished its record died some other way."""
    launch = ev.launch
    if launch is None:
        return None
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


def _ran_to_its_end(ev: Evidence) -> Observation | None:
    if ev.launch is None:
        return None
    if ev.kind == "bug":
        return Observation(NOT_REPRODUCED)
    if ev.kind == "crosscheck":
        return Observation(Outcome.AGREES)
    pass_rule = ev.own.pass_rule if ev.own is not None else None
    if pass_rule == "clean-exit":
        # A user's script with its workaround, or a repro that trains with another library's trainer
        # (F18: TRL's): it ran to its end on every rank (it records no training facts of the fixed
        # trainer's to judge).
        return Observation(PASS, reasons=("every rank ran the script to its end",))
    if pass_rule == "agrees" and ev.kind == "fixed":
        # Held against one process: a difference would have raised TrainsUnlikeOneProcess (FAIL above).
        return Observation(PASS, reasons=("trained what one process trains on the same global batch",))
    problems = judge_training(ev.ranks)
    if not problems:
        return Observation(PASS)
    return Observation(FAIL if ev.kind == "fixed" else Outcome.SILENT_FAILURE, reasons=tuple(problems))


#: What the ranks' records say, in order (the damaged environment's step keeps the error these name).
RANK_STEPS: tuple[Step, ...] = (
    Step("the machine", _machine),
    Step("hang", _hang),
    Step("unavailable", _unavailable),
    Step("killed", _killed),
    Step("setup or import", _setup_or_import),
    Step("signature", _signature),
    Step("stack failure", _stack_failure),
    Step("raised", _raised),
    Step("no final record", _no_final_record),
    Step("ran to its end", _ran_to_its_end),
)
#: The decision tree: the first step that answers decides.
STEPS: tuple[Step, ...] = (
    Step("no environment", _no_environment),
    Step("not started", _not_started),
    Step("attempts", _attempts),
    Step("damaged environment", _damaged_environment),
    *RANK_STEPS,
)


def _first_answer(steps: Sequence[Step], ev: Evidence) -> Observation | None:
    for step in steps:
        answer = step.decide(ev)
        if answer is not None:
            return answer
    return None


def classify(
    kind: str,
    own: ReproSpec | None,
    launch: LaunchResult | None = None,
    known: Sequence[ReproSpec] = (),
    *,
    no_environment: str | None = None,
    not_started: str | None = None,
    damage: str | None = None,
    attempts: Sequence[str] = (),
    expected: str | None = None,
) -> Observation:
    """The outcome of an item of ``kind`` (``own``: its repro, ``known``: every documented failure), from
    what was observed of it: its launch, or why nothing was launched (``no_environment``,
    ``not_started``), what changed in its environment meanwhile (``damage``), or every attempt's
    outcome under ``--repeat`` (``attempts``, the item's ``expected`` outcome beside)."""
    if kind not in KINDS:
        raise ValueError(f"no such kind of item: {kind!r} (one of {', '.join(KINDS)})")
    evidence = Evidence(
        kind=kind,
        own=own,
        known=known,
        launch=launch,
        no_environment=no_environment,
        not_started=not_started,
        damage=damage,
        attempts=tuple(attempts),
        expected=expected,
    )
    answer = _first_answer(STEPS, evidence)
    if answer is None:
        raise ValueError("nothing to classify: no launch, no reason it was not launched, no attempts")
    return answer
