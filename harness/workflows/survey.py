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


def _still_open(opts: SurveyOptions, atlas: AtlasFile, discovery: Discovery, env: Environment) -> list[str]:
    """The failures ``env`` still has a question to answer for (an earlier environment may have answered some)."""
    mine = [s for s in opts.stacks if s.id in env.answers_for]
    open_ = questions(atlas, discovery, mine, env.failures, opts.device)
    return [
        f
        for f in env.failures
        if any(q.failure == f and key_of(env.stack, discovery.repros[f].spec.deciding_packages) == q.key for q in open_)
    ]


def _run(
    opts: SurveyOptions,
    discovery: Discovery,
    make_run: RunFactory,
    console: Console,
    stack: Stack,
    day: str,
    failures: Sequence[str],
    what: str,
) -> tuple[int, Path | None]:
    specs = [discovery.repros[f].spec for f in failures]
    matrix = stack_matrix(stack, specs, opts.out, passthrough=False, as_of=day, what=what)
    console.print(f"running {','.join(failures)} in {what} ({matrix})", highlight=False, markup=False)
    return run_stack(make_run(matrix, failures, None), console, opts.argv)


def prove_stacks(
    opts: SurveyOptions, discovery: Discovery, make_run: RunFactory, console: Console, atlas: AtlasFile
) -> tuple[int, AtlasFile]:
    """Run each planned environment, the atlas rebuilt after each; stops at an interruption."""
    envs = plan(opts, atlas, discovery)
    describe_plan(envs, console)
    for env in envs:
        failures = _still_open(opts, atlas, discovery, env)
        if not failures:
            console.print(f"{env.stack.id}: answered meanwhile, nothing to run", highlight=False, markup=False)
            continue
        what = f"surveyed stack {env.stack.id} ({env.stack.source.text()})"
        status, path = _run(opts, discovery, make_run, console, env.stack.stack, env.stack.date, failures, what)
        atlas = folded(opts.out, discovery)
        if status == EXIT_INTERRUPTED or path is None:
            return status, atlas
    return 0, atlas


def _later(a: str, b: str) -> str:
    return max(a, b)


def _name(d: Disagreement) -> str:
    return f"{d.failure}-{d.affected.id}-{d.clean.id}"


def _verdict(atlas: AtlasFile, discovery: Discovery, stack: Stack, failure: str, device: str) -> str:
    (answer,) = check_stack(atlas, discovery, stack, where_of(stack, device, None, None), [failure])
    return answer.verdict


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


def find_package(
    opts: SurveyOptions,
    discovery: Discovery,
    make_run: RunFactory,
    console: Console,
    atlas: AtlasFile,
    d: Disagreement,
) -> tuple[str | None, AtlasFile, list[str]]:
    """The deciding package whose move alone (in the affected stack, to the clean stack's release) clears the
    failure; each move a real run. None where none does alone."""
    tried: list[str] = []
    day = _later(d.affected.date, d.clean.date)
    for package in _known_first(atlas, d):
        release = d.clean.stack.versions[package]
        moved = Stack(
            source=f"{d.affected.id} with {package}=={release}",
            versions={**d.affected.stack.versions, package: release},
        )
        verdict = _verdict(atlas, discovery, moved, d.failure, opts.device)
        if verdict not in (AFFECTED, NOT_AFFECTED):
            what = f"{d.affected.id} with {package} moved alone to {release} (as {d.clean.id} has it)"
            status, _ = _run(opts, discovery, make_run, console, moved, day, [d.failure], what)
            atlas = folded(opts.out, discovery)
            if status == EXIT_INTERRUPTED:
                return None, atlas, tried
            verdict = _verdict(atlas, discovery, moved, d.failure, opts.device)
        tried.append(f"{package} {d.affected.stack.versions[package]} -> {release}: {verdict}")
        if verdict == NOT_AFFECTED:
            return package, atlas, tried
    return None, atlas, tried


def bisect_disagreement(
    opts: SurveyOptions,
    discovery: Discovery,
    make_run: RunFactory,
    console: Console,
    atlas: AtlasFile,
    d: Disagreement,
) -> AtlasFile:
    """Find the package that moved and bisect it to a boundary under the affected stack's other packages."""
    where = opts.out / BISECTS_DIR / _name(d)
    if (where / BISECT_FILE).is_file() or (where / NOTE_FILE).is_file():
        return atlas  # looked into already (a survey resumed)
    console.print(f"disagreement: {d.describe()}", highlight=False, markup=False)
    package: str | None
    tried: list[str] = []
    if len(d.moved) == 1:
        (package,) = d.moved
    else:
        package, atlas, tried = find_package(opts, discovery, make_run, console, atlas, d)
    note: dict[str, object] = {"disagreement": d.describe(), "moved alone": tried}
    bad, good = d.affected.stack.versions.get(package or ""), d.clean.stack.versions.get(package or "")
    if package is None or _version(bad) is None or _version(good) is None:
        note["result"] = "no single package clears it alone: the boundary lies in a combination; left unknown"
        where.mkdir(parents=True, exist_ok=True)
        (where / NOTE_FILE).write_text(json.dumps(note, indent=1) + "\n", encoding="utf-8")
        console.print(f"  {note['result']}", highlight=False, markup=False)
        return atlas
    assert bad is not None and good is not None
    spec = discovery.repros[d.failure].spec
    what = f"{d.affected.id}, the base of a bisect of {package} for {d.failure}"
    matrix = stack_matrix(
        d.affected.stack, [spec], opts.out, passthrough=False, as_of=_later(d.affected.date, d.clean.date), what=what
    )
    run = make_run(matrix, [d.failure], where)
    console.print(f"bisecting {package} {bad} -> {good} for {d.failure} under {d.affected.id}", highlight=False)
    try:
        report = run_bisect(
            BisectOptions(
                run=run,
                repro=d.failure,
                mode="bug",
                package=package,
                good=str(Version(good).public),
                bad=str(Version(bad).public),
                cell=CELL,
            ),
            console,
        )
    except UserError as exc:  # a release not on the index, endpoints that are one release: said, not fatal
        note["result"] = f"not bisected: {exc}"
        where.mkdir(parents=True, exist_ok=True)
        (where / NOTE_FILE).write_text(json.dumps(note, indent=1) + "\n", encoding="utf-8")
        console.print(f"  {note['result']}", highlight=False, markup=False)
        return atlas
    console.print(f"  {report.final}", highlight=False, markup=False)
    note["result"] = report.final if report.status == FOUND else f"{report.status}: {report.final}"
    (where / NOTE_FILE).write_text(json.dumps(note, indent=1) + "\n", encoding="utf-8")
    return folded(opts.out, discovery)


def run_survey(opts: SurveyOptions, discovery: Discovery, make_run: RunFactory, console: Console) -> int:
    """The survey of ``opts.stacks``; 0 where every one of their questions is answered, 1 where some stay unknown,
    the session's own status where it was interrupted."""
    atlas = folded(opts.out, discovery)
    status, atlas = prove_stacks(opts, discovery, make_run, console, atlas)
    if status == EXIT_INTERRUPTED:
        return status
    slice_ids = {s.id for s in opts.stacks}
    looked = 0
    for d in disagreements(atlas, discovery, opts.survey, opts.failures, opts.device):
        if looked >= opts.bisects:
            break
        if d.affected.id not in slice_ids and d.clean.id not in slice_ids:
            continue
        if any(p for p in d.moved if _already_drawn(atlas, d, p)):
            continue
        looked += 1
        atlas = bisect_disagreement(opts, discovery, make_run, console, atlas, d)
    return summarize(opts, atlas, discovery, console)


def _already_drawn(atlas: AtlasFile, d: Disagreement, package: str) -> bool:
    """Whether a drawn boundary (a bisect's, a watch night's) of the failure along ``package`` lies between the
    two stacks' releases, under the affected stack's other packages."""
    entry = atlas.failure(d.failure)
    if entry is None:
        return False
    low, high = sorted(filter(None, (_version(v) for v in d.moved.get(package, (None, None)))))[:2] or (None, None)
    for b in entry.boundaries:
        if b.package != package or b.source not in ("bisect", "watch"):
            continue
        edge = _version(b.first_good or b.first_bad)
        held = all(
            d.affected.stack.versions.get(p) is not None and f"=={key}" == spec
            for p, spec in b.under.items()
            if p in d.affected.stack.versions
            for key in [dict(key_of(d.affected, [p]))[p]]
        )
        if edge is not None and low is not None and high is not None and low < edge <= high and held:
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
