"""``python -m harness bisect``: which release of a package changed a repro's outcome.

The base cell's packages stay as they are; the bisected package is pinned to each
released version between the endpoints in turn. Both endpoints are run first. "Bad"
means what the bad endpoint showed (the same outcome and signature id), not any
failure; a step whose environment cannot be built, or that ends INFRA or HANG, is
skipped. Environments come from the shared cache, so a rerun builds nothing new.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import shlex
import sys
import time
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version
from rich.console import Console

from harness.config.matrix import Cell, Matrix
from harness.core.errors import UserError
from harness.core.invocation import program, program_text
from harness.core.names import one_of, unknown_repro_fix
from harness.environments import Environments, EnvironmentUnavailable, Resolved
from harness.environments.cache import GB, cache_bytes, recorded_size
from harness.environments.releases import VersionsUnavailable, between, released_versions
from harness.execution.containment.leftovers import sweep_dead_runs
from harness.pipeline.executors import ExecutorContext, ItemJob, make_executor
from harness.pipeline.item_runner import ItemRunner
from harness.planning.commands import crosscheck_command, run_command
from harness.planning.crosscheck import CROSSCHECK
from harness.planning.crosscheck import planned as planned_crosscheck
from harness.planning.items import PlannedItem, repro_of
from harness.planning.run_options import AttemptPolicy, RunOptions, StackChoice
from harness.records.bisect import BISECT_FILE, FOUND, BisectReport, Step
from harness.records.item import ItemRecord
from harness.records.provenance import host_info
from harness.records.results import ResultsWriter
from harness.records.run_dir import RunDir
from harness.records.run_meta import new_run_id
from harness.reports.progress import still_under_way
from harness.workflows.bisect.axes import DateAxis, VersionAxis
from harness.workflows.bisect.search import SearchResult, State, search
from repros.runtime.outcomes import UNOBSERVED
from repros.trainer.crosscheck.strategy import UnknownStrategy
from repros.trainer.crosscheck.strategy import parse as parse_strategy

#: One item per environment: a cell's pre-imported worker would save nothing.
BISECT_LAUNCHER = "torchrun"


@dataclass(frozen=True)
class BisectOptions:
    """What to bisect (the repro, its mode, the package or the days, the two ends), beside the run's
    own options (``run``: the matrix and repros, the cache, the executor, ``--as-of`` over the base
    cell, where the steps' directory goes)."""

    run: RunOptions
    repro: str
    mode: str
    package: str | None
    good: str
    bad: str
    by_date: bool = False
    hold: tuple[str, ...] = ()
    cell: str | None = None
    pre: bool = False
    verify: int = 0
    #: The base cell itself, where the caller made one (``watch``: a cell at last night's lock);
    #: else the matrix's ``cell``.
    base: Cell | None = None


def signature_of(record: ItemRecord) -> tuple[str, str | None]:
    return record.outcome, record.signature


def state_of(record: ItemRecord, bad: tuple[str, str | None], good: tuple[str, str | None] | None = None) -> State:
    """``bad``/``good``: what that endpoint showed (outcome and signature id); ``skip``: nothing
    was observed (no environment, INFRA, HANG); ``other``: it failed some other way than both
    endpoints (a different error, an ImportError): never counted as good."""
    if record.outcome in UNOBSERVED:
        return "skip"
    observed = signature_of(record)
    if observed == bad:
        return "bad"
    if good is None or observed == good:
        return "good"
    return "other"


def base_cell(matrix: Matrix, name: str | None) -> Cell:
    if name is not None:
        if "," in name:
            raise UserError("--cells", name, "names more than one cell", "bisect holds one base cell: name one")
        if name not in matrix.cells:
            raise UserError(matrix.path, "--cells", f"no cell named {name!r}", one_of(name, matrix.cells))
        cell = matrix.cells[name]
    else:
        lane_cells = matrix.cells_in_lane(matrix.default_lane) if matrix.default_lane else []
        cell = (lane_cells or list(matrix.cells.values()))[0]
    if not cell.installs_packages:
        raise UserError(
            matrix.path,
            f"cells.{cell.name}",
            f"its provider ({cell.provider}) does not install packages, so none can be bisected",
            "pass --cells with a cell that lists packages",
        )
    return cell


def _version(flag: str, text: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion:
        raise UserError(flag, text, "is not a version", "write a release such as 0.19.2") from None


def bisect_points(opts: BisectOptions) -> list[Version]:
    if not opts.package:
        raise UserError("--package", "", "is required", "name the package to bisect, or pass --by-date")
    good, bad = _version("--good", opts.good), _version("--bad", opts.bad)
    if good == bad:
        raise UserError("--good/--bad", opts.good, "the endpoints are the same version", "give two different releases")
    try:
        available = released_versions(opts.package, pre=opts.pre)
    except VersionsUnavailable as exc:
        raise UserError(
            "--package",
            opts.package,
            f"no released versions found ({exc})",
            "check the package name and the configured indexes",
        ) from None
    for flag, wanted in (("--good", good), ("--bad", bad)):
        if wanted not in available:
            near = [str(v) for v in available if not v.is_prerelease][-5:]
            raise UserError(
                flag,
                str(wanted),
                f"{opts.package} {wanted} is not on the index",
                f"pick a released version (latest: {', '.join(near)})",
            )
    return between(available, min(good, bad), max(good, bad), pre=opts.pre)


class StepRunner:
    """Runs the item at one point after another: the point's cell made (its environment built or
    reused from the shared cache), the item run by the item runner over the run's executor, as
    ``run`` runs one (locally, or on a cluster's node, which builds the environment itself)."""

    def __init__(
        self,
        opts: BisectOptions,
        cell: Cell,
        axis: VersionAxis | DateAxis,
        environments: Environments,
        run_dir: RunDir,
        run_id: str,
        writer: ResultsWriter,
        console: Console,
    ) -> None:
        self.opts = opts
        self.cell = cell
        self.axis = axis
        self.environments = environments
        self.run_dir = run_dir
        # One item per environment: a pre-imported worker would save nothing.
        choice = opts.run.executor.evolve(launcher=BISECT_LAUNCHER, jobs=1)
        self.executor = make_executor(ExecutorContext(run_dir, run_id, choice, opts.run.cache, environments))
        self.runner = ItemRunner(self.executor, AttemptPolicy(), run_dir)
        self.run_id = run_id
        self.writer = writer
        self.console = console
        self.repro = repro_of(opts.run, self._item(cell))
        self._by_identity: dict[Hashable, ItemRecord] = {}
        self.records: dict[str, ItemRecord] = {}
        self.steps: list[Step] = []
        self.environments_built = 0

    def record(self, point: str) -> ItemRecord:
        if point in self.records:
            return self.records[point]
        identity = self.axis.identity(point)
        if identity in self._by_identity:
            self.records[point] = self._by_identity[identity].evolve(bisect_step_s=0.0, same_as_earlier=True)
            return self.records[point]
        started = time.perf_counter()
        observed = self._observe(point)
        record = observed.evolve(bisect_point=point, bisect_step_s=round(time.perf_counter() - started, 3))
        self.writer.append(record)
        self.records[point] = self._by_identity[identity] = record
        return record

    def _observe(self, point: str) -> ItemRecord:
        """The step: the point's cell, its environment made ready here (locally; a node makes its
        own) and released after, the item run once."""
        resolved: Resolved | None = None
        try:
            cell = self.axis.cell(self.cell, point)
            if self.executor.builds_environments:
                resolved = self._ready(cell, point)
        except EnvironmentUnavailable as exc:
            cell, resolved = self._unavailable_cell(point), Resolved(None, exc.reason)
        job = ItemJob(self.run_id, self._item(cell), self.repro, self._command(cell, self._stack(point, cell)))
        observed = self.runner.run(job, resolved)
        assert observed is not None, "a bisect's runner is never stopped"
        if resolved is not None and resolved.env is not None:
            self.executor.cell_done(resolved)
            self.environments.release(resolved.env)  # the step is over: the cache may evict it for the next one
        if observed.env is not None and not observed.env.reused:
            self.environments_built += 1
        return observed

    def _say(self, text: str) -> None:
        self.console.print(text, highlight=False, markup=False)

    def _ready(self, cell: Cell, point: str) -> Resolved:
        """The point's environment: at once where it is built already, else built, saying so while it is."""
        if self.environments.cached(cell):
            return self.environments.for_cell(cell)
        what = f"{self.axis.label(point)}: its environment"
        self._say(f"{what}: building it (uv installs the cell's packages; minutes the first time, about a GB on disk)")
        with still_under_way(self._say, f"{what} is being built"):
            return self.environments.for_cell(cell)

    def _stack(self, point: str, cell: Cell) -> StackChoice:
        """What chose the point's stack, for its rerun command: the point's own pins, always (the
        rerun names the version it tried even where the matrix cell holds it today, so that it still
        does when the matrix moves), every other package the step's cell holds otherwise than its
        matrix cell (those the base cell was given: ``watch`` bisects at last night's versions), and
        the day floating specs resolve as of (the end of the point's day, or the bisect's ``--as-of``)."""
        run = self.opts.run
        declared = run.matrix.cells.get(cell.origin or cell.name)
        chosen = {
            name: spec
            for name, spec in cell.packages.items()
            if declared is None or declared.packages.get(name) != spec
        }
        chosen.update(self.axis.pins(point) if isinstance(self.axis, VersionAxis) else ())
        pins = tuple(sorted(chosen.items()))
        as_of = DateAxis.as_of(point) if isinstance(self.axis, DateAxis) else run.stack.as_of
        return run.stack.evolve(pins=pins, as_of=as_of)

    def _unavailable_cell(self, point: str) -> Cell:
        """The base cell named for a point whose environment could not even be described."""
        return dataclasses.replace(
            self.cell, name=f"{self.cell.name}@{point}", origin=self.cell.origin or self.cell.name
        )

    def _item(self, cell: Cell) -> PlannedItem:
        if self.opts.repro == CROSSCHECK:
            items, _ = planned_crosscheck(
                [cell], [parse_strategy(self.opts.mode)], {"seed": 0, "steps": self.opts.run.matrix.crosscheck.steps}
            )
            return items[0]
        repro = self.opts.run.discovery.repros[self.opts.repro]
        return PlannedItem(
            cell, self.opts.repro, repro.module, self.opts.mode, repro.spec.world_size or cell.world_size
        )

    def _command(self, cell: Cell, stack: StackChoice) -> str:
        run = self.opts.run
        if self.opts.repro == CROSSCHECK:
            return crosscheck_command(run.matrix.path, self._item(cell), stack, run.cache)
        return run_command(
            run.matrix.path,
            cell,
            self.opts.repro,
            self.opts.mode,
            stack,
            run.cache,
            run.selection.repros_dirs,
            module=self.repro.module,
        )

    def close(self) -> None:
        self.executor.close()

    def report_step(self, point: str, state: State, role: str) -> None:
        rec = self.records[point]
        env = rec.env
        if rec.same_as_earlier:
            how = "same resolution as an earlier step, not run again"
        elif env is None:
            how = "no environment"
        else:
            size = recorded_size(Path(env.path)) if env.path else None
            took = "reused" if env.reused else f"built {env.build_s:.0f}s"
            how = f"environment {took}" + (f", {size / GB:.1f} GB" if size else "")
        step = Step(
            n=len(self.steps) + 1,
            role=role,
            point=point,
            outcome=rec.outcome,
            signature=rec.signature,
            state=state,
            seconds=rec.bisect_step_s or 0.0,
            environment=how,
            env_key=env.key if env else None,
            error=rec.error,
        )
        self.steps.append(step)
        sig = f" [{step.signature}]" if step.signature else ""
        self.console.print(
            f"step {step.n} ({role}): {self.axis.label(point)} → {rec.outcome}{sig} = {state} "
            f"({step.seconds:.1f}s, {how})",
            highlight=False,
            markup=False,  # "[F1.recompute-shape-0]" is a signature, not a style
        )


def unknown_points(axis: VersionAxis | DateAxis, result: SearchResult[str], records: dict[str, ItemRecord]) -> str:
    """``; A and B failed differently (ImportError); C could not run (INFRA)`` for the final line."""

    def how(point: str) -> str:
        record = records.get(point)
        if record is None:
            return "?"
        return record.error.type if record.error else str(record.outcome)

    parts = []
    for points, what in ((result.others, "failed differently"), (result.skipped, "could not run")):
        if points:
            names = [axis.label(p) for p in points]
            joined = ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else names[0]
            kinds = ", ".join(sorted({how(p) for p in points}))
            parts.append(f"{joined} {what} ({kinds})")
    return "".join(f"; {part}" for part in parts)


def date_points(opts: BisectOptions) -> list[str]:
    days = []
    for flag, text in (("--good", opts.good), ("--bad", opts.bad)):
        try:
            days.append(dt.date.fromisoformat(text))
        except ValueError:
            raise UserError(flag, text, "is not a date", "write it like 2026-06-30") from None
    good, bad = days
    if good == bad:
        raise UserError("--good/--bad", opts.good, "the endpoints are the same day", "give two different dates")
    if max(good, bad) > dt.date.today():
        raise UserError("--good/--bad", str(max(good, bad)), "is in the future", "give dates up to today")
    low = min(good, bad)
    return [str(low + dt.timedelta(days=i)) for i in range(abs((bad - good).days) + 1)]


def execute_bisect(opts: BisectOptions, console: Console) -> int:
    """``bisect``: run it, print the final line (the last of its output), what to do next (on stderr,
    after it), and exit 0 only where a boundary was found."""
    report = run_bisect(opts, console)
    print(report.final, flush=True)
    print(next_step(report, opts), file=sys.stderr, flush=True)
    return 0 if report.status == FOUND else 1


def next_step(report: BisectReport, opts: BisectOptions) -> str:
    """What a bisect's result asks of the one who ran it, and where its steps are."""
    steps = Path(report.directory) / BISECT_FILE
    if report.status != FOUND or report.boundary is None:
        return f"next: each step's outcome, signature and rerun command are in {steps}"
    before = report.before_boundary()
    if report.axis == "date":
        since = f"released after {before}" if before else "released on it"
        return f"next: the change is among what was {since} (listed above); the steps are in {steps}"
    package, boundary = report.package, report.boundary
    since = f" (its changes since {before})" if before else ""
    cell = ["--cells", report.base_cell] if report.base_cell else []
    me = shlex.join([*program(), "run", *cell, "--repros", report.repro, "--modes", report.mode])
    if report.kind == "regression":
        advice = f"keep {package}<{boundary} until it is fixed, and report it upstream with the steps"
    else:
        advice = f"upgrade to {package}>={boundary}"
    again = f"{me} --pin {package}=={boundary}"
    return f"next: the change is in {package} {boundary}{since}: {advice}; see it again: {again}; the steps: {steps}"


def run_bisect(opts: BisectOptions, console: Console) -> BisectReport:
    run = opts.run
    if opts.repro == CROSSCHECK:
        try:
            parse_strategy(opts.mode)
        except UnknownStrategy as exc:
            raise UserError("--mode", opts.mode, f"is no crosscheck strategy: {exc}", "see crosscheck --list") from None
    elif opts.repro not in run.discovery.repros:
        raise UserError("--repro", opts.repro, "unknown repro", unknown_repro_fix(opts.repro, run.discovery.repros))
    else:
        modes = run.discovery.repros[opts.repro].spec.modes
        if opts.mode not in modes:
            raise UserError("--mode", opts.mode, f"{opts.repro} has no such mode", f"use one of: {', '.join(modes)}")
    cell = opts.base or base_cell(run.matrix, opts.cell)
    if run.stack.as_of:
        cell = dataclasses.replace(cell, as_of=run.stack.as_of)
    environments = Environments(run.cache.path, cache_max_gb=run.cache.cache_max_gb)
    axis: VersionAxis | DateAxis
    if opts.by_date:
        for name in opts.hold:
            if name not in cell.packages:
                raise UserError(
                    "--hold", name, f"cell {cell.name} has no such package", f"use one of: {', '.join(cell.packages)}"
                )
        points = date_points(opts)
        good, bad = opts.good, opts.bad
        axis = DateAxis(cell, environments.uv, opts.hold)
        what = f"the days {points[0]} … {points[-1]} ({len(points)} days, holding {', '.join(opts.hold) or 'nothing'})"
    else:
        if opts.package and opts.package not in cell.packages:
            raise UserError(
                "--package",
                opts.package,
                f"cell {cell.name} does not install it",
                f"bisect one of its packages: {', '.join(cell.packages)}",
            )
        points = [str(v) for v in bisect_points(opts)]
        good, bad = str(Version(opts.good)), str(Version(opts.bad))
        axis = VersionAxis(str(opts.package))
        what = f"{opts.package} {points[0]} … {points[-1]} ({len(points)} releases)"
    run_id = new_run_id()
    run_dir = RunDir.create(run.out_dir or (run.reports_dir / f"bisect-{run_id}"))
    out = run_dir.path
    console.print(
        f"bisect {opts.repro}/{opts.mode} over {what} in cell {cell.name}; good {good}, bad {bad}", highlight=False
    )
    started = time.perf_counter()
    sweep_dead_runs()
    with run_dir.locked(), run_dir.writer() as writer:
        steps = StepRunner(opts, cell, axis, environments, run_dir, run_id, writer, console)
        try:
            # The endpoints first: what each showed defines "bad" and "good" for every step.
            bad_signature = signature_of(steps.record(bad))
            good_signature = signature_of(steps.record(good))

            def probe(point: str, role: str) -> State:
                state = state_of(steps.record(point), bad_signature, good_signature)
                steps.report_step(point, state, role)
                return state

            result = search(points, probe, verify=opts.verify)
        finally:
            steps.close()
        final = axis.final(result) + unknown_points(axis, result, steps.records)
    moved_on = axis.moved_on(result.boundary) if isinstance(axis, DateAxis) and result.boundary else {}
    summary = {
        "run_id": run_id,
        "repro": opts.repro,
        "mode": opts.mode,
        "axis": "date" if opts.by_date else "version",
        "package": opts.package,
        "hold": list(opts.hold),
        "good": good,
        "bad": bad,
        "bad_signature": list(bad_signature),
        "base_cell": cell.name,
        "base_packages": cell.packages,
        "matrix": str(run.matrix.path),
        "points": points,
        "kind": result.kind,
        "status": result.status,
        "boundary": result.boundary,
        "candidates": result.candidates,
        "skipped": result.skipped,
        "failed_differently": result.others,
        "contradictions": [dataclasses.asdict(p) for p in result.contradictions],
        "resolutions": axis.resolutions if isinstance(axis, DateAxis) else None,
        "locks": {day: list(lines) for day, lines in axis.locks.items()} if isinstance(axis, DateAxis) else None,
        "moved_on_boundary": moved_on,
        "steps": [s.model_dump(mode="json") for s in steps.steps],
        "environments_built": steps.environments_built,
        "wall_s": round(time.perf_counter() - started, 3),
        "host": host_info(),
        "final": final,
        "directory": str(out),
        "as_of": run.stack.as_of,
    }
    report = BisectReport.model_validate(summary)
    tmp = out / f"{BISECT_FILE}.tmp"
    tmp.write_text(json.dumps(report.model_dump(mode="json"), indent=1))
    os.replace(tmp, out / BISECT_FILE)
    cache = ""
    if steps.environments_built:
        taken = cache_bytes(run.cache.path) / GB
        cache = f" (the environment cache, {run.cache.path}, takes {taken:.1f} GB on disk: {program_text()} cache list)"
    console.print(
        f"{len(steps.steps)} steps, {steps.environments_built} environments built"
        f"{cache}, {report.wall_s:.0f}s; steps in {out / BISECT_FILE}",
        highlight=False,
        markup=False,
    )
    return report
