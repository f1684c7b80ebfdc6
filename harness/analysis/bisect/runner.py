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
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict
from rich.console import Console

from harness.analysis.bisect.axes import DateAxis, VersionAxis
from harness.analysis.bisect.search import FOUND, SearchResult, State, search
from harness.config.matrix import Cell, Matrix
from harness.config.repros import Discovery
from harness.core.errors import UserError
from harness.core.names import one_of, unknown_repro_fix
from harness.environments import Environments, EnvironmentUnavailable, Resolved
from harness.environments.releases import VersionsUnavailable, between, released_versions
from harness.execution.containment.leftovers import sweep_dead_runs
from harness.execution.launchers import LauncherContext, make_launcher
from harness.pipeline.executors import Executor, ExecutorContext, ItemJob, make_executor
from harness.pipeline.executors.lost import attempt_until_not_lost
from harness.pipeline.observe import observe_item
from harness.pipeline.session import new_run_id
from harness.planning.commands import run_command
from harness.planning.items import PlannedItem
from harness.records.item import ErrorSummary, ItemRecord
from harness.records.provenance import host_info
from harness.records.results import ResultsWriter
from harness.records.run_dir import RunDir
from repros.runtime.outcomes import UNOBSERVED, Outcome

BISECT_FILE = "bisect.json"
#: One item per environment: a cell's pre-imported worker would save nothing.
BISECT_LAUNCHER = "torchrun"


class Step(BaseModel):
    """One step of a bisect, as ``bisect.json`` lists it."""

    model_config = ConfigDict(frozen=True)

    n: int
    role: str
    point: str
    outcome: Outcome
    signature: str | None
    #: good, bad, other (failed some other way) or skip (nothing observed).
    state: str
    seconds: float
    environment: str
    env_key: str | None
    error: ErrorSummary | None


@dataclass(frozen=True)
class BisectOptions:
    matrix: Matrix
    discovery: Discovery
    repro: str
    mode: str
    package: str | None
    good: str
    bad: str
    cache_dir: Path
    by_date: bool = False
    hold: tuple[str, ...] = ()
    cell: str | None = None
    out_dir: Path | None = None
    reports_dir: Path = Path("reports")
    pre: bool = False
    verify: int = 0
    repros_dirs: tuple[Path, ...] = ()
    #: Floating specs of the base cell resolve as of this day (``--as-of``).
    as_of: str | None = None
    #: The environment cache's budget (``--cache-max-gb``).
    cache_max_gb: float | None = None
    #: The base cell itself, where the caller made one (``watch``: a cell at last night's lock);
    #: else the matrix's ``cell``.
    base: Cell | None = None
    #: Where each step runs (``--executor``): "local" builds and runs it here; "ray"/"slurm" on a node.
    executor: str = "local"
    #: Whether ``cache_dir`` was given (``--cache-dir``): then the nodes build there too (a shared path).
    cache_dir_given: bool = False
    ray_address: str | None = None
    slurm_folder: Path | None = None
    slurm_parameters: tuple[tuple[str, str], ...] = ()


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
        if name not in matrix.cells:
            raise UserError(matrix.path, "--cell", f"no cell named {name!r}", one_of(name, matrix.cells))
        cell = matrix.cells[name]
    else:
        lane_cells = matrix.cells_in_lane(matrix.default_lane) if matrix.default_lane else []
        cell = (lane_cells or list(matrix.cells.values()))[0]
    if not cell.installs_packages:
        raise UserError(
            matrix.path,
            f"cells.{cell.name}",
            f"its provider ({cell.provider}) does not install packages, so none can be bisected",
            "pass --cell with a cell that lists packages",
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
    """Builds (or reuses) the environment for one point and runs the item there."""

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
        self.launcher = make_launcher(BISECT_LAUNCHER, LauncherContext(log_dir=run_dir.workers_dir))
        #: A cluster's executor where the steps run on its nodes (``--executor ray|slurm``).
        self.executor: Executor | None = None
        if opts.executor != "local":
            context = ExecutorContext(
                run_dir=run_dir.path,
                node_cache_dir=opts.cache_dir if opts.cache_dir_given else None,
                cache_max_gb=opts.cache_max_gb,
                launcher=BISECT_LAUNCHER,
                jobs=1,
                ray_address=opts.ray_address,
                slurm_folder=opts.slurm_folder,
                slurm_parameters=opts.slurm_parameters,
            )
            self.executor = make_executor(opts.executor, context, run_dir, run_id, None)
        self.run_id = run_id
        self.writer = writer
        self.console = console
        self.repro = opts.discovery.repros[opts.repro]
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
        observed = self._observe_on_node(point) if self.executor is not None else self._observe_here(point)
        record = observed.evolve(bisect_point=point, bisect_step_s=round(time.perf_counter() - started, 3))
        self.writer.append(record)
        self.records[point] = self._by_identity[identity] = record
        return record

    def _observe_here(self, point: str) -> ItemRecord:
        """The step on this machine: the point's environment made ready here, released after."""
        try:
            cell = self.axis.cell(self.cell, point)
            resolved = self.environments.for_cell(cell)
        except EnvironmentUnavailable as exc:
            cell, resolved = self._unavailable_cell(point), Resolved(None, exc.reason)
        env = resolved.env
        if env is not None and not env.reused:
            self.environments_built += 1
        pins = self.axis.pins(point) if env is not None else ()
        observed = observe_item(
            run_id=self.run_id,
            item=self._item(cell),
            repro=self.repro,
            resolved=resolved,
            run_dir=self.run_dir,
            launcher=self.launcher,
            repro_cmd=self._command(cell, pins),
            environments=self.environments,
        )
        if env is not None:
            self.environments.release(env)  # the step is over: the cache may evict it for the next one
        return observed

    def _observe_on_node(self, point: str) -> ItemRecord:
        """The step on a node of the cluster: the node builds the point's environment."""
        assert self.executor is not None
        try:
            cell = self.axis.cell(self.cell, point)
        except EnvironmentUnavailable as exc:
            cell = self._unavailable_cell(point)
            return observe_item(
                run_id=self.run_id,
                item=self._item(cell),
                repro=self.repro,
                resolved=Resolved(None, exc.reason),
                run_dir=self.run_dir,
                launcher=self.launcher,
                repro_cmd=self._command(cell, ()),
            )
        job = ItemJob(self.run_id, self._item(cell), self.repro, self._command(cell, self.axis.pins(point)))
        observed = attempt_until_not_lost(self.executor, job, None, ()).record
        if observed.env is not None and not observed.env.reused:
            self.environments_built += 1
        return observed

    def _unavailable_cell(self, point: str) -> Cell:
        """The base cell named for a point whose environment could not even be described."""
        return dataclasses.replace(self.cell, name=f"{self.cell.name}@{point}")

    def _item(self, cell: Cell) -> PlannedItem:
        return PlannedItem(
            cell, self.opts.repro, self.repro.module, self.opts.mode, self.repro.spec.world_size or cell.world_size
        )

    def _command(self, cell: Cell, pins: Sequence[tuple[str, str]]) -> str:
        return run_command(
            self.opts.matrix.path,
            cell,
            self.opts.repro,
            self.opts.mode,
            tuple(pins),
            self.opts.cache_dir,
            self.opts.repros_dirs,
            module=self.repro.module,
        )

    def close(self) -> None:
        if self.executor is not None:
            self.executor.close()

    def report_step(self, point: str, state: State, role: str) -> None:
        rec = self.records[point]
        env = rec.env
        if rec.same_as_earlier:
            how = "same resolution as an earlier step, not run again"
        elif env is None:
            how = "no environment"
        else:
            how = "environment reused" if env.reused else f"environment built {env.build_s:.0f}s"
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


class BisectReport(BaseModel):
    """What a bisect found (``bisect.json``): the boundary, or why there is none, with every step."""

    model_config = ConfigDict(frozen=True, extra="allow")

    run_id: str
    repro: str
    mode: str
    axis: str
    package: str | None
    good: str
    bad: str
    points: list[str]
    #: regression (good older, bad newer) or fix (bad older, good newer).
    kind: str
    #: found, ambiguous, non-monotonic, endpoints-agree or endpoint-unusable.
    status: str
    boundary: str | None
    candidates: list[str]
    skipped: list[str]
    failed_differently: list[str]
    #: With ``--by-date``: the packages that moved on the day found, (before, after), and each day
    #: resolved: the base cell's packages -> version.
    moved_on_boundary: dict[str, tuple[str | None, str | None]] = {}
    resolutions: dict[str, dict[str, str]] | None = None
    #: With ``--by-date``: each day resolved, every package (``name==version`` lines).
    locks: dict[str, list[str]] | None = None
    steps: list[Step]
    environments_built: int
    wall_s: float
    final: str
    directory: str

    def before_boundary(self) -> str | None:
        """The point just before the boundary: the last with the older endpoint's outcome."""
        if self.boundary is None or self.boundary not in self.points:
            return None
        i = self.points.index(self.boundary)
        return self.points[i - 1] if i > 0 else None


def execute_bisect(opts: BisectOptions, console: Console) -> int:
    """``bisect``: run it, print the final line, and exit 0 only where a boundary was found."""
    report = run_bisect(opts, console)
    print(report.final, flush=True)
    return 0 if report.status == FOUND else 1


def run_bisect(opts: BisectOptions, console: Console) -> BisectReport:
    if opts.repro not in opts.discovery.repros:
        raise UserError("--repro", opts.repro, "unknown repro", unknown_repro_fix(opts.repro, opts.discovery.repros))
    modes = opts.discovery.repros[opts.repro].spec.modes
    if opts.mode not in modes:
        raise UserError("--mode", opts.mode, f"{opts.repro} has no such mode", f"use one of: {', '.join(modes)}")
    cell = opts.base or base_cell(opts.matrix, opts.cell)
    if opts.as_of:
        cell = dataclasses.replace(cell, as_of=opts.as_of)
    environments = Environments(opts.cache_dir, cache_max_gb=opts.cache_max_gb)
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
    run_dir = RunDir.create(opts.out_dir or (opts.reports_dir / f"bisect-{run_id}"))
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
        "matrix": str(opts.matrix.path),
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
        "as_of": opts.as_of,
    }
    report = BisectReport.model_validate(summary)
    tmp = out / f"{BISECT_FILE}.tmp"
    tmp.write_text(json.dumps(report.model_dump(mode="json"), indent=1))
    os.replace(tmp, out / BISECT_FILE)
    console.print(
        f"{len(steps.steps)} steps, {steps.environments_built} environments built, {report.wall_s:.0f}s; "
        f"steps in {out / BISECT_FILE}",
        highlight=False,
    )
    return report
