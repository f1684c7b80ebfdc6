"""``explain``: which documented failure a traceback or CI log shows, and what the harness measured
about it.

Every exception in the log (``harness.analysis.explain.logs``) is matched with the same signatures the runs
use: each repro's ``SPEC.signatures``, their type (or alias), pattern and message checks. What a
log cannot hold is said, not guessed: a signature that also needs the failing run's scenario
facts (F5 against DeepSpeed#3339), or a user's signature whose checks run only in a rank, is a
probable match with the reason. For each match: the versions the harness measured as affected
and as fixed (the repro's ``bug`` expectations, with the command that established them), where
the user's versions fall, the fixed trainer's guards against it, and each workaround's measured
cost from a ``costs.json``. With no match: "not a documented failure", and the closest
candidates with what differs.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from packaging.version import InvalidVersion, Version

from harness.analysis.explain.logs import LoggedError
from harness.config.expectations import holds
from harness.config.repros import Repro
from harness.core.invocation import program_text
from harness.reports.cost_table import CostEntry, Pricing
from repros.runtime import patterns
from repros.runtime.context import TRACKED_PACKAGES
from repros.runtime.outcomes import Outcome
from repros.runtime.patterns import PatternRunaway
from repros.runtime.spec import Expectation, ReproSpec, Signature
from repros.trainer.guards import GUARDS

DOCUMENTED, PROBABLE, NEAR = "documented", "probable", "near"
#: How many near candidates are shown when nothing matches.
CANDIDATES = 3


@dataclass(frozen=True)
class SignatureMatch:
    repro: Repro
    signature: Signature
    error: LoggedError
    #: ``documented`` (every check a log allows passed), ``probable`` (the text matches; what
    #: else the signature needs is not in a log) or ``near`` (something differs: ``why``).
    status: str
    score: float
    why: str = ""


def _doc(check: Callable[..., Any]) -> str:
    doc = str(getattr(check, "__doc__", None) or getattr(check, "__name__", "a check")).strip()
    return " ".join(doc.split())


def _readable(pattern: str) -> str:
    """A regular expression as the text it looks for, for similarity."""
    return re.sub(r"\\(.)", r"\1", re.sub(r"\(\?:|[()^$?*+]|\[[^\]]*\]|\\[wdsb]", " ", pattern)).lower()


def _similarity(error: LoggedError, signature: Signature) -> float:
    wanted = _readable(signature.pattern) or signature.description.lower()
    return difflib.SequenceMatcher(None, error.first_line[:300].lower(), wanted[:300]).ratio()


def _checks_failing(signature: Signature, message: str) -> list[str]:
    failing = []
    for check in signature.checks:
        try:
            ok = bool(check(message))
        except Exception:  # noqa: BLE001 - a check that fails does not match
            ok = False
        if not ok:
            failing.append(_doc(check))
    return failing


def match_signature(repro: Repro, signature: Signature, error: LoggedError) -> SignatureMatch:
    exact = error.type == signature.exception or error.type in signature.aliases
    by_name = not exact and "." not in error.type and error.type == signature.exception.rsplit(".", 1)[-1]
    try:
        found = patterns.search(signature.pattern, error.message)
    except PatternRunaway as runaway:
        return SignatureMatch(repro, signature, error, NEAR, 0.0, f"not matched: {runaway}")
    similarity = _similarity(error, signature)
    if (exact or by_name) and found:
        failing = _checks_failing(signature, error.message)
        named = " (the log names the type without its module)" if by_name else ""
        if failing:
            return SignatureMatch(
                repro,
                signature,
                error,
                NEAR,
                2.0 + similarity,
                f"type and message match, but not its check: {failing[0]}",
            )
        if signature.verdict_from_rank:
            return SignatureMatch(
                repro,
                signature,
                error,
                PROBABLE,
                2.5,
                "type and message match; its own checks run only in a rank" + named,
            )
        if signature.facts_checks:
            needs = "; ".join(_doc(c) for c in signature.facts_checks)
            return SignatureMatch(
                repro,
                signature,
                error,
                PROBABLE,
                2.5,
                f"type and message match; it also needs what the failing run recorded, which a log "
                f"does not hold: {needs}" + named,
            )
        return SignatureMatch(repro, signature, error, DOCUMENTED, 3.0 - (0.1 if by_name else 0.0), named.strip())
    if exact or by_name:
        return SignatureMatch(
            repro,
            signature,
            error,
            NEAR,
            1.0 + similarity,
            f"same type, but the message does not match /{signature.pattern}/",
        )
    if found:
        return SignatureMatch(
            repro,
            signature,
            error,
            NEAR,
            1.5,
            f"the message matches, but the type is {error.type}, not {signature.exception}",
        )
    return SignatureMatch(
        repro, signature, error, NEAR, similarity, f"{signature.exception} /{signature.pattern}/ against {error.type}"
    )


@dataclass(frozen=True)
class Explanation:
    errors: list[LoggedError]
    #: The best match per repro, documented and probable ones, best first.
    matches: list[SignatureMatch]
    #: With no match: the closest signatures, best first.
    candidates: list[SignatureMatch]

    @property
    def found(self) -> bool:
        return bool(self.matches)


def explain(errors: Sequence[LoggedError], repros: Sequence[Repro]) -> Explanation:
    """Every error against every repro's signatures. The built-in (documented) repros first."""
    scored = [match_signature(r, s, e) for e in errors for r in repros for s in r.spec.signatures]
    best: dict[str, SignatureMatch] = {}
    for m in scored:
        if m.status != NEAR and (m.repro.id not in best or m.score > best[m.repro.id].score):
            best[m.repro.id] = m
    matches = sorted(best.values(), key=lambda m: (not m.repro.builtin, -m.score, m.repro.id))
    candidates: list[SignatureMatch] = []
    if not matches:
        seen: set[str] = set()
        for m in sorted(scored, key=lambda m: -m.score):
            if m.repro.id not in seen and m.score > 0.25:
                seen.add(m.repro.id)
                candidates.append(m)
        candidates = candidates[:CANDIDATES]
    return Explanation(list(errors), matches, candidates)


# -- what the harness measured -------------------------------------------------------------------------


def _when(expectation: Expectation) -> str:
    text = ", ".join(f"{k}{v}" for k, v in expectation.when.items()) or "every version measured"
    return text + (f" (on {expectation.device})" if expectation.device else "")


#: How the built-in repros' expectations name the program that established them.
_RECORDED_PROGRAM = re.compile(r"(?<![\w/.-])python -m harness(?= )")


def as_typed_here(command: str) -> str:
    """A recorded command (``python -m harness run ...``) with the program the user runs now in its place
    (``ft-regress``, where they ran that): the two are one program."""
    return _RECORDED_PROGRAM.sub(program_text(), command)


def measured_lines(spec: ReproSpec) -> list[str]:
    """The versions measured as affected and as fixed, and the commands that established them."""
    lines = []
    labels: dict[str, str] = {Outcome.REPRODUCED: "affected", Outcome.NOT_REPRODUCED: "fixed"}
    bug = [e for e in spec.expectations if e.mode == "bug"]
    for e in bug:
        label = labels.get(e.outcome, f"other ({e.outcome})")
        note = f" - {e.note}" if e.note else ""
        lines.append(f"{label}: {_when(e)} ({e.outcome}){note}")
    if not bug:
        lines.append("no versions measured yet (the repro declares no expectation)")
    for source in dict.fromkeys(e.established_by for e in bug if e.established_by):
        lines.append(f"established by: {as_typed_here(source)}")
    return lines


def relevant_packages(spec: ReproSpec) -> list[str]:
    named = [k for e in spec.expectations for k in e.when]
    return list(dict.fromkeys([*named, *TRACKED_PACKAGES]))


def versions_line(spec: ReproSpec, versions: Mapping[str, str]) -> list[str]:
    """Where the user's versions fall among the measured ranges."""
    shown = ", ".join(f"{p} {versions[p]}" for p in relevant_packages(spec) if p in versions)
    lines = [f"your versions: {shown or 'none of the packages it depends on'}"]
    covering = [e for e in spec.expectations if e.mode == "bug" and e.when and holds(e.when, versions)]
    if not covering:
        lines.append("no measured range covers your versions")
        return lines
    first = covering[0]
    if first.outcome == Outcome.REPRODUCED:
        lines.append(f"in the range measured as affected: {_when(first)}")
    elif first.outcome == Outcome.NOT_REPRODUCED:
        lines.append(
            f"in a range measured as fixed ({_when(first)}): this log's failure may have another cause, or "
            "your stack differs from the measured one in a package not named there"
        )
    else:
        lines.append(f"in a range measured as {first.outcome}: {_when(first)}")
    return lines


def _guard_versions(versions: Mapping[str, str]) -> dict[str, Version | None]:
    parsed: dict[str, Version | None] = {}
    for name, text in versions.items():
        try:
            parsed[name] = Version(text)
        except InvalidVersion:
            parsed[name] = None
    return parsed


def guard_lines(repro_id: str, versions: Mapping[str, str] | None) -> list[str]:
    lines = []
    for rule in GUARDS.values():
        if rule.works_around_failure(repro_id):
            effect = ", ".join(f"{k}={v!r}" for k, v in rule.effect.items())
            why = rule.reason(_guard_versions(versions)) if versions else rule.reason({})
            why = why.replace("None <", "<")
            lines.append(f"the fixed trainer's guard {rule.id} ({effect}): {why}")
    return lines


def _ratio(value: float | None, what: str) -> str | None:
    return None if value is None else f"{what} x{value:.2f}"


def cost_lines(spec: ReproSpec, entries: Sequence[CostEntry]) -> list[str]:
    """Each workaround of the repro with what ``costs`` measured, per cell."""
    mine = [e for e in entries if e.repro == spec.id]
    lines = []
    for name in spec.variant_names():
        variant = spec.variant(name)
        claim = f" [advised in {variant.claim}]" if variant.claim else ""
        measured = [e for e in mine if e.variant == name]
        if not measured:
            lines.append(f"{name}: {variant.description}{claim} - not measured")
            continue
        parts = []
        for entry in measured:
            text = f"{entry.cell} {entry.outcome}" + (f" {entry.signature}" if entry.signature else "")
            priced = entry.against_documented or Pricing()
            memory = _ratio(priced.train_peak_mem_ratio, "memory")
            cpu = _ratio(priced.step_cpu_time_s_ratio, "CPU time")
            if priced.step_cpu_noise_ratio is not None and cpu:
                cpu += f" (noise ±{priced.step_cpu_noise_ratio:.0%})"
            figures = [f for f in (memory, cpu) if f]
            if figures:
                text += ": " + ", ".join(figures)
            elif priced.why_not:
                text += f" (not priced: {priced.why_not})"
            parts.append(text)
        model = measured[0].model
        size = f" [{model} model]" if model else ""
        lines.append(f"{name}: {variant.description}{claim} - {'; '.join(parts)}{size}")
    return lines
