"""What ``atlas survey`` has left to prove for the surveyed stacks, and the fewest environments that prove it.

A **question** is a surveyed stack and a documented failure the atlas answers ``unknown`` for it (and that a run
could settle: nothing else was proven there) on the device the survey runs on. What decides it is the stack's
release of each package the failure depends on (``depends_on``): two stacks that agree on those share the answer,
so one run answers both (a run's record is a claim of one point over exactly those packages).

An **environment** is one surveyed stack, built as it is, running the failures of every question whose deciding
releases it has. The environments are chosen greedily, each the stack that answers most of the questions still
open (ties: the one with fewer packages, then the earlier), which gives the fewest in practice (set cover); they
run in the order of their torch release, then their day, so that each torch build is needed for one stretch of
the survey only and the cache's budget can let it go after.

A **disagreement** is a failure two surveyed stacks answer differently (one affected, one not): the packages that
decide it and moved between them are where a boundary lies. Nothing here runs anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from harness.analysis.atlas.check import AFFECTED, NOT_AFFECTED, UNKNOWN, Answer, check_stack, where_of
from harness.analysis.atlas.model import AtlasFile
from harness.analysis.atlas.regions import public
from harness.analysis.atlas.survey import SurveyStack
from harness.config.repros import Discovery
from repros.runtime.outcomes import Outcome
from repros.runtime.spec import ReproSpec

#: One release per deciding package (None: the stack has none of it).
Key = tuple[tuple[str, str | None], ...]


def runnable_on(spec: ReproSpec, device: str) -> bool:
    """Whether the failure's ``bug`` mode can show anything on ``device``: not where its SPEC says every stack ends
    INFRA there (a CUDA-only failure on a CPU)."""
    return not any(
        e.mode == "bug" and e.outcome == Outcome.INFRA and e.device == device and not e.when for e in spec.expectations
    )


def key_of(stack: SurveyStack, packages: Iterable[str]) -> Key:
    """The stack's release of each package (a build's label dropped: ``2.9.0+cu129`` is 2.9.0)."""
    return tuple((p, public(v) if (v := stack.stack.versions.get(p)) is not None else None) for p in packages)


def _release(version: str | None) -> Version:
    try:
        return Version(public(version)) if version else Version("0")
    except InvalidVersion:
        return Version("0")


@dataclass(frozen=True)
class Question:
    stack: SurveyStack
    failure: str
    key: Key


@dataclass(frozen=True)
class Environment:
    """A surveyed stack built as it is, and the failures it runs: one per question it answers."""

    stack: SurveyStack
    failures: tuple[str, ...]
    #: The surveyed stacks whose questions it answers (its own first where it has any).
    answers_for: tuple[str, ...]

    def describe(self) -> str:
        others = [s for s in self.answers_for if s != self.stack.id]
        also = f"; answers {', '.join(others)} too" if others else ""
        return f"{self.stack.id}: {self.stack.text()} on {self.stack.date}, runs {','.join(self.failures)}{also}"


def answers(
    atlas: AtlasFile, discovery: Discovery, stack: SurveyStack, failures: Sequence[str], device: str
) -> list[Answer]:
    """The atlas's answer for the stack, failure by failure, on ``device``."""
    return check_stack(atlas, discovery, stack.stack, where_of(stack.stack, device, None, None), failures)


def questions(
    atlas: AtlasFile, discovery: Discovery, stacks: Sequence[SurveyStack], failures: Sequence[str], device: str
) -> list[Question]:
    """Every (stack, failure) the atlas leaves ``unknown`` that a run of the stack could settle."""
    found = []
    for stack in stacks:
        for answer in answers(atlas, discovery, stack, failures, device):
            if answer.verdict == UNKNOWN and answer.provable:
                spec = discovery.repros[answer.failure].spec
                found.append(Question(stack, answer.failure, key_of(stack, spec.deciding_packages)))
    return found


def environments(
    questions: Sequence[Question], stacks: Sequence[SurveyStack], discovery: Discovery
) -> list[Environment]:
    """The fewest environments (greedily) whose runs answer every question, in torch's order, then the day's."""
    open_ = list(questions)
    chosen: list[Environment] = []
    order = {s.id: i for i, s in enumerate(stacks)}

    def covers(stack: SurveyStack, question: Question) -> bool:
        return key_of(stack, discovery.repros[question.failure].spec.deciding_packages) == question.key

    while open_:
        best = max(
            stacks,
            key=lambda s: (
                sum(1 for q in open_ if covers(s, q)),
                -len(s.stack.versions),
                -order[s.id],
            ),
        )
        mine = [q for q in open_ if covers(best, q)]
        if not mine:  # every question is some surveyed stack's own: cannot happen, but never loop for ever
            break
        failures = tuple(dict.fromkeys(q.failure for q in sorted(mine, key=lambda q: _failure_order(q.failure))))
        ids = tuple(dict.fromkeys([*(q.stack.id for q in mine if q.stack.id == best.id), *(q.stack.id for q in mine)]))
        chosen.append(Environment(best, failures, ids))
        open_ = [q for q in open_ if q not in mine]
    return sorted(chosen, key=lambda e: (_release(e.stack.stack.versions.get("torch")), e.stack.date, e.stack.id))


def _failure_order(failure: str) -> tuple[int, str]:
    digits = "".join(c for c in failure if c.isdigit())
    return (int(digits) if digits else 0, failure)


def torch_builds(plan: Sequence[Environment]) -> list[str]:
    """The torch releases the environments need, in order (each a build of its own on disk)."""
    return list(
        dict.fromkeys(public(e.stack.stack.versions["torch"]) for e in plan if "torch" in e.stack.stack.versions)
    )


@dataclass(frozen=True)
class Disagreement:
    """A failure one surveyed stack has and another has not, and the deciding packages that moved between them."""

    failure: str
    affected: SurveyStack
    clean: SurveyStack
    #: Package -> (the affected stack's release, the clean one's).
    moved: Mapping[str, tuple[str | None, str | None]]

    def describe(self) -> str:
        moved = ", ".join(f"{p} {a} -> {b}" for p, (a, b) in self.moved.items())
        return f"{self.failure}: {self.affected.id} affected, {self.clean.id} not ({moved})"


def disagreements(
    atlas: AtlasFile, discovery: Discovery, stacks: Sequence[SurveyStack], failures: Sequence[str], device: str
) -> list[Disagreement]:
    """For each failure, the pairs of surveyed stacks the atlas answers differently, nearest first (fewest deciding
    packages moved, then the closest days): where a boundary between them is still to be drawn."""
    verdicts: dict[str, dict[str, str]] = {}
    for stack in stacks:
        for answer in answers(atlas, discovery, stack, failures, device):
            verdicts.setdefault(answer.failure, {})[stack.id] = answer.verdict
    by_id = {s.id: s for s in stacks}
    found = []
    for failure in failures:
        spec = discovery.repros[failure].spec
        seen = verdicts.get(failure, {})
        bad = [by_id[i] for i, v in seen.items() if v == AFFECTED]
        good = [by_id[i] for i, v in seen.items() if v == NOT_AFFECTED]
        for a in bad:
            for b in good:
                moved = {
                    p: (va, vb)
                    for (p, va), (_, vb) in zip(
                        key_of(a, spec.deciding_packages), key_of(b, spec.deciding_packages), strict=True
                    )
                    if va != vb
                }
                if moved:
                    found.append(Disagreement(failure, a, b, moved))
    return sorted(
        found,
        key=lambda d: (
            _failure_order(d.failure),
            len(d.moved),
            abs(_day(d.affected.date) - _day(d.clean.date)),
            d.affected.id,
            d.clean.id,
        ),
    )


def _day(text: str) -> int:
    year, month, day = (int(x) for x in text[:10].split("-"))
    return year * 372 + month * 31 + day


def unanswered(
    atlas: AtlasFile, discovery: Discovery, stacks: Sequence[SurveyStack], failures: Sequence[str], device: str
) -> dict[str, list[Answer]]:
    """Each stack's answers that are still ``unknown`` (by stack id; stacks with none left out)."""
    left = {}
    for stack in stacks:
        still = [a for a in answers(atlas, discovery, stack, failures, device) if a.verdict == UNKNOWN]
        if still:
            left[stack.id] = still
    return left
