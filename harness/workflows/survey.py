"""``atlas survey``: prove what the atlas cannot answer for the stacks people run, and draw the boundaries between them.

Everything the survey does is kept in its directory (``--out``): ``atlas.json`` and ``index.html`` (the atlas,
rebuilt after each run), ``stacks/`` (each environment as a matrix of one cell, so every record's rerun command
names a file that exists), ``runs/`` (one run per environment) and ``bisects/`` (one per boundary it looked for).

1. The atlas is brought up to date: the kept ``atlas.json`` and every run or bisect under the directory it does
   not hold yet (a survey stopped half way: what its runs recorded counts, the rest runs again).
2. For the slice's stacks, the questions the atlas leaves ``unknown`` and a run could settle, and the fewest
   environments that answer them (``survey_plan.py``), in torch's order. Each environment is one surveyed stack,
   its packages as the stack has them, everything else resolved as of the stack's own day (nothing released after
   it installed); its failures' ``bug`` mode runs through the same planning and session as ``run``, one
   environment at a time, so the cache's budget (``--cache-max-gb``) can let each go once it is done. After each
   run the atlas is rebuilt with it: a survey stopped resumes where it stopped.
3. Where two surveyed stacks disagree (one affected, one not), the package that moved is found and bisected to a
   boundary: where one deciding package moved, that one; where several did, each is moved alone in the affected
   stack (those with a boundary already known for the failure first) and the one whose move alone clears it is
   bisected. The bisect runs under the affected stack's other packages, which the boundary then carries.

Every answer comes from a real run, recorded with its command; a stack whose environment cannot be built, or
whose run shows something else, stays ``unknown`` with why.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version
from rich.console import Console

from harness.analysis.atlas.build import assemble, write_build
from harness.analysis.atlas.check import AFFECTED, NOT_AFFECTED, check_stack, where_of
from harness.analysis.atlas.evidence import read_sources
from harness.analysis.atlas.model import ATLAS_FILE, AtlasFile, read_atlas
from harness.analysis.atlas.regions import contains
from harness.analysis.atlas.survey import SurveyStack
from harness.analysis.atlas.survey_plan import (
    Disagreement,
    Environment,
    disagreements,
    environments,
    key_of,
    questions,
    torch_builds,
    unanswered,
)
from harness.config.repros import Discovery
from harness.core.errors import UserError
from harness.environments.stacks import Stack
from harness.pipeline.session import EXIT_INTERRUPTED
from harness.planning.run_options import RunOptions
from harness.records.bisect import BISECT_FILE, FOUND
from harness.records.run_dir import RESULTS_FILE
from harness.workflows.bisect.runner import BisectOptions, run_bisect
from harness.workflows.prove import CELL, RUNS_DIR, run_stack, stack_matrix

BISECTS_DIR = "bisects"
#: What the survey notes of each disagreement it looked into (``bisects/<name>/survey.json``).
NOTE_FILE = "survey.json"
#: How large a CUDA build of torch is on disk, with its libraries (what each torch release the survey needs costs).
TORCH_BUILD_GB = 5.0

#: (matrix, failures, out_dir) -> the options of a run of those failures in that matrix's cell; ``out_dir`` None:
#: a new run directory under the survey's ``runs/``.
RunFactory = Callable[[Path, Sequence[str], Path | None], RunOptions]


@dataclass(frozen=True)
class SurveyOptions:
    out: Path
    #: Every surveyed stack, and the slice this invocation proves (the whole survey where not sliced).
    survey: Sequence[SurveyStack]
    stacks: Sequence[SurveyStack]
    failures: Sequence[str]
    #: The device the runs run on (this machine's).
    device: str
    #: The most disagreements looked into (each a bisect, and the moves alone that find its package).
    bisects: int
    argv: Sequence[str]


def folded(out: Path, discovery: Discovery, write: bool = True) -> AtlasFile:
    """The survey's atlas with every run and bisect under ``out`` it does not hold yet; written back (``write``)."""
    kept = out / ATLAS_FILE
    held = set(read_atlas(kept).sources) if kept.is_file() else set()
    new = [
        d
        for parent in (out / RUNS_DIR, out / BISECTS_DIR)
        if parent.is_dir()
        for d in sorted(parent.iterdir())
        if ((d / RESULTS_FILE).is_file() or (d / BISECT_FILE).is_file()) and str(d) not in held
    ]
    sources = read_sources([*([out] if kept.is_file() else []), *new], discovery)
    atlas = assemble(discovery, sources)
    if write:
        write_build(out, atlas, sources, discovery)
    return atlas


def plan(opts: SurveyOptions, atlas: AtlasFile, discovery: Discovery) -> list[Environment]:
    return environments(questions(atlas, discovery, opts.stacks, opts.failures, opts.device), opts.stacks, discovery)


def describe_plan(envs: Sequence[Environment], console: Console) -> None:
    builds = torch_builds(envs)
    console.print(
        f"{len(envs)} environments to build and run; torch {', '.join(builds) or 'none'} "
        f"(a CUDA build of torch takes about {TORCH_BUILD_GB:.0f} GB with its libraries)",
        highlight=False,
        markup=False,
    )
    for env in envs:
        console.print(f"  {env.describe()}", highlight=False, markup=False)


def _name(d: Disagreement) -> str:
    return f"{d.failure}-{d.affected.id}-{d.clean.id}"


def _version(text: str | None) -> Version | None:
    try:
        return Version(text) if text else None
    except InvalidVersion:
        return None


def _known_first(atlas: AtlasFile, d: Disagreement) -> list[str]:
    """The moved packages, those a boundary of the failure is already known along first, then torch last (its
    builds are the largest)."""
    entry = atlas.failure(d.failure)
    known = {b.package for b in entry.boundaries} if entry else set()
    movable = [p for p, (a, b) in d.moved.items() if a is not None and b is not None]
    return sorted(movable, key=lambda p: (p not in known, p == "torch", p))


@dataclass
class Survey:
    """One survey under way: its options, the catalog, how a run is made, where it speaks, and the atlas so far."""

    opts: SurveyOptions
    discovery: Discovery
    make_run: RunFactory
    console: Console
    atlas: AtlasFile

    def say(self, text: str) -> None:
        self.console.print(text, highlight=False, markup=False, soft_wrap=True)

    def run(self, stack: Stack, day: str, failures: Sequence[str], what: str) -> tuple[int, Path | None]:
        """``failures``' bug mode in ``stack`` (everything else resolved as of ``day``); the atlas folded after."""
        specs = [self.discovery.repros[f].spec for f in failures]
        matrix = stack_matrix(stack, specs, self.opts.out, passthrough=False, as_of=day, what=what)
        self.say(f"running {','.join(failures)} in {what} ({matrix})")
        status, path = run_stack(self.make_run(matrix, failures, None), self.console, self.opts.argv)
        self.atlas = folded(self.opts.out, self.discovery)
        return status, path

    def verdict(self, stack: Stack, failure: str) -> str:
        (answer,) = check_stack(
            self.atlas, self.discovery, stack, where_of(stack, self.opts.device, None, None), [failure]
        )
        return answer.verdict

    def still_open(self, env: Environment) -> list[str]:
        """The failures ``env`` still has a question to answer for (an earlier environment may have answered some)."""
        mine = [s for s in self.opts.stacks if s.id in env.answers_for]
        open_ = questions(self.atlas, self.discovery, mine, env.failures, self.opts.device)
        deciding = {f: key_of(env.stack, self.discovery.repros[f].spec.deciding_packages) for f in env.failures}
        return [f for f in env.failures if any(q.failure == f and deciding[f] == q.key for q in open_)]

    def prove_stacks(self) -> int:
        """Run each planned environment, the atlas rebuilt after each; stops at an interruption."""
        envs = plan(self.opts, self.atlas, self.discovery)
        describe_plan(envs, self.console)
        for env in envs:
            failures = self.still_open(env)
            if not failures:
                self.say(f"{env.stack.id}: answered meanwhile, nothing to run")
                continue
            what = f"surveyed stack {env.stack.id} ({env.stack.source.text()})"
            status, path = self.run(env.stack.stack, env.stack.date, failures, what)
            if status == EXIT_INTERRUPTED or path is None:
                return status
        return 0

    def find_package(self, d: Disagreement) -> tuple[str | None, list[str]]:
        """The deciding package whose move alone (in the affected stack, to the clean stack's release) clears the
        failure, each move a real run (None where none does alone); and what each move showed."""
        tried: list[str] = []
        for package in _known_first(self.atlas, d):
            release = d.clean.stack.versions[package]
            moved = Stack(
                source=f"{d.affected.id} with {package}=={release}",
                versions={**d.affected.stack.versions, package: release},
            )
            verdict = self.verdict(moved, d.failure)
            if verdict not in (AFFECTED, NOT_AFFECTED):
                what = f"{d.affected.id} with {package} moved alone to {release} (as {d.clean.id} has it)"
                status, _ = self.run(moved, max(d.affected.date, d.clean.date), [d.failure], what)
                if status == EXIT_INTERRUPTED:
                    return None, tried
                verdict = self.verdict(moved, d.failure)
            tried.append(f"{package} {d.affected.stack.versions[package]} -> {release}: {verdict}")
            if verdict == NOT_AFFECTED:
                return package, tried
        return None, tried

    def bisect(self, d: Disagreement) -> None:
        """Find the package that moved and bisect it to a boundary under the affected stack's other packages;
        what was found noted in ``bisects/<name>/survey.json``."""
        where = self.opts.out / BISECTS_DIR / _name(d)
        if (where / BISECT_FILE).is_file() or (where / NOTE_FILE).is_file():
            return  # looked into already (a survey resumed)
        self.say(f"disagreement: {d.describe()}")
        package, tried = (next(iter(d.moved)), []) if len(d.moved) == 1 else self.find_package(d)
        note: dict[str, object] = {"disagreement": d.describe(), "moved alone": tried}
        bad, good = d.affected.stack.versions.get(package or ""), d.clean.stack.versions.get(package or "")
        if package is None or bad is None or good is None or _version(bad) is None or _version(good) is None:
            self._note(where, note, "no single package clears it alone: the boundary lies in a combination")
            return
        spec = self.discovery.repros[d.failure].spec
        matrix = stack_matrix(
            d.affected.stack,
            [spec],
            self.opts.out,
            passthrough=False,
            as_of=max(d.affected.date, d.clean.date),
            what=f"{d.affected.id}, the base of a bisect of {package} for {d.failure}",
        )
        self.say(f"bisecting {package} {bad} -> {good} for {d.failure} under {d.affected.id}")
        try:
            report = run_bisect(
                BisectOptions(
                    run=self.make_run(matrix, [d.failure], where),
                    repro=d.failure,
                    mode="bug",
                    package=package,
                    good=str(Version(good).public),
                    bad=str(Version(bad).public),
                    cell=CELL,
                ),
                self.console,
            )
        except UserError as exc:  # a release not on the index, endpoints that are one release: said, not fatal
            self._note(where, note, f"not bisected: {exc}")
            return
        self._note(where, note, report.final if report.status == FOUND else f"{report.status}: {report.final}")
        self.atlas = folded(self.opts.out, self.discovery)

    def _note(self, where: Path, note: dict[str, object], result: str) -> None:
        where.mkdir(parents=True, exist_ok=True)
        (where / NOTE_FILE).write_text(json.dumps({**note, "result": result}, indent=1) + "\n", encoding="utf-8")
        self.say(f"  {result}")


def run_survey(opts: SurveyOptions, discovery: Discovery, make_run: RunFactory, console: Console) -> int:
    """The survey of ``opts.stacks``; 0 where every one of their questions is answered, 1 where some stay unknown,
    the session's own status where it was interrupted."""
    survey = Survey(opts, discovery, make_run, console, folded(opts.out, discovery))
    status = survey.prove_stacks()
    if status == EXIT_INTERRUPTED:
        return status
    slice_ids = {s.id for s in opts.stacks}
    looked = 0
    for d in disagreements(survey.atlas, discovery, opts.survey, opts.failures, opts.device):
        if looked >= opts.bisects:
            break
        if d.affected.id not in slice_ids and d.clean.id not in slice_ids:
            continue
        if any(_already_drawn(survey.atlas, d, p) for p in d.moved):
            continue
        looked += 1
        survey.bisect(d)
    return summarize(opts, survey.atlas, discovery, console)


def _already_drawn(atlas: AtlasFile, d: Disagreement, package: str) -> bool:
    """Whether a boundary a bisect or a watch night drew for the failure along ``package`` lies between the two
    stacks' releases, under the affected stack's other packages: the disagreement is explained already."""
    entry = atlas.failure(d.failure)
    ends = sorted(v for v in (_version(x) for x in d.moved.get(package, (None, None))) if v is not None)
    if entry is None or len(ends) < 2:
        return False
    low, high = ends
    versions = d.affected.stack.versions
    for b in entry.boundaries:
        edge = _version(b.first_good or b.first_bad)
        if b.package != package or b.source not in ("bisect", "watch") or edge is None or not low < edge <= high:
            continue
        held = {p: spec for p, spec in b.under.items() if p in versions and p != package}
        if all(contains(spec, versions[p]) for p, spec in held.items()):
            return True
    return False


def summarize(opts: SurveyOptions, atlas: AtlasFile, discovery: Discovery, console: Console) -> int:
    """Each stack of the slice: its answers, counted; what stays unknown, with why. 1 where something does."""
    left = unanswered(atlas, discovery, opts.stacks, opts.failures, opts.device)
    for stack in opts.stacks:
        answers = check_stack(
            atlas, discovery, stack.stack, where_of(stack.stack, opts.device, None, None), opts.failures
        )
        counts = {v: sum(1 for a in answers if a.verdict == v) for v in ("affected", "not affected", "unknown")}
        affected = ",".join(a.failure for a in answers if a.verdict == AFFECTED) or "-"
        console.print(
            f"{stack.id}: {counts['affected']} affected ({affected}), {counts['not affected']} not affected, "
            f"{counts['unknown']} unknown",
            highlight=False,
            markup=False,
        )
        for answer in left.get(stack.id, []):
            console.print(f"  {answer.line()}", highlight=False, markup=False, soft_wrap=True)
    console.print(f"kept in {opts.out / ATLAS_FILE}", highlight=False, markup=False)
    return 1 if left else 0
