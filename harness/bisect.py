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
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version
from rich.console import Console

from harness.bisect_search import FOUND, SearchResult, State, search
from harness.environments import Environments, EnvironmentUnavailable, Resolved, UvEnvironments
from harness.errors import UserError
from harness.launchers import TorchrunLauncher
from harness.leftovers import sweep_dead_runs
from harness.matrix import Cell, Matrix
from harness.observe import observe_item
from harness.package_versions import VersionsUnavailable, between, released_versions
from harness.pipeline import new_run_id
from harness.planning import PlannedItem, pinned_cell
from harness.provenance import host_info
from harness.records import ItemRecord
from harness.repro_registry import Discovery
from harness.rerun import run_command
from harness.results import ResultsWriter
from harness.run_dir import RunDir
from harness.suggest import one_of, unknown_repro_fix
from repros.common.outcomes import UNOBSERVED

BISECT_FILE = "bisect.json"


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


def signature_of(record: ItemRecord) -> tuple[str, str | None]:
    return record["outcome"], record.get("signature")


def state_of(record: ItemRecord, bad: tuple[str, str | None], good: tuple[str, str | None] | None = None) -> State:
    """``bad``/``good``: what that endpoint showed (outcome and signature id); ``skip``: nothing
    was observed (no environment, INFRA, HANG); ``other``: it failed some other way than both
    endpoints (a different error, an ImportError): never counted as good."""
    if record["outcome"] in UNOBSERVED:
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
    if cell.passthrough:
        raise UserError(
            matrix.path,
            f"cells.{cell.name}",
            "a passthrough cell cannot be bisected",
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


class VersionAxis:
    """Bisect over the released versions of one package."""

    def __init__(self, package: str) -> None:
        self.package = package

    def label(self, point: str) -> str:
        return f"{self.package}=={point}"

    def pins(self, point: str) -> tuple[tuple[str, str], ...]:
        return ((self.package, f"=={point}"),)

    def cell(self, base: Cell, point: str) -> Cell:
        return pinned_cell(base, self.pins(point))

    def identity(self, point: str) -> Hashable:
        return point

    def final(self, result: SearchResult[str]) -> str:
        return final_line(self.package, result)


class DateAxis:
    """Bisect over days: the base cell's packages, unpinned (except those held),
    resolved as of the end of each day (uv's --exclude-newer). Days that resolve to
    the same versions are one observation."""

    def __init__(self, base: Cell, builder: UvEnvironments, hold: tuple[str, ...]) -> None:
        self.base = base
        self.builder = builder
        self.hold = hold
        #: Each day resolved so far: package -> version.
        self.resolutions: dict[str, dict[str, str]] = {}

    @staticmethod
    def cutoff(day: str) -> str:
        return f"{dt.date.fromisoformat(day) + dt.timedelta(days=1)}T00:00:00Z"

    def requirements(self) -> list[str]:
        return [name + (self.base.packages[name] if name in self.hold else "") for name in sorted(self.base.packages)]

    def resolution(self, day: str) -> dict[str, str]:
        if day not in self.resolutions:
            # Named only where the cell has exclusions (a resolver that knows none need not take them).
            excluded = {"exclude_packages": self.base.exclude_packages} if self.base.exclude_packages else {}
            resolved = self.builder.resolve(self.requirements(), self.base.python, self.cutoff(day), **excluded)
            self.resolutions[day] = {name: resolved[name] for name in self.base.packages if name in resolved}
        return self.resolutions[day]

    def label(self, point: str) -> str:
        return point

    def pins(self, point: str) -> tuple[tuple[str, str], ...]:
        return tuple((name, f"=={version}") for name, version in sorted(self.resolution(point).items()))

    def cell(self, base: Cell, point: str) -> Cell:
        return dataclasses.replace(
            base,
            name=f"{base.name}@{point}",
            packages=dict(self.pins(point)),
            exclude_newer=self.cutoff(point),
            origin=base.origin or base.name,
        )

    def identity(self, point: str) -> Hashable:
        try:
            return tuple(sorted(self.resolution(point).items()))
        except EnvironmentUnavailable:
            return ("unresolvable", point)

    def final(self, result: SearchResult[str]) -> str:
        line = final_line("", result).replace(" ==", " ")
        if result.status != FOUND or result.boundary is None:
            return line
        day = dt.date.fromisoformat(result.boundary)
        before = self.resolution(str(day - dt.timedelta(days=1)))
        after = self.resolution(str(day))
        changed = [
            f"{n} {before.get(n, '-')} -> {after.get(n, '-')}" for n in sorted(after) if before.get(n) != after[n]
        ]
        return f"{line} ({', '.join(changed) or 'no named package changed'})"


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
        self.launcher = TorchrunLauncher()
        self.run_id = run_id
        self.writer = writer
        self.console = console
        self.repro = opts.discovery.repros[opts.repro]
        self._by_identity: dict[Hashable, ItemRecord] = {}
        self.records: dict[str, ItemRecord] = {}
        self.steps: list[dict[str, Any]] = []
        self.environments_built = 0

    def record(self, point: str) -> ItemRecord:
        if point in self.records:
            return self.records[point]
        identity = self.axis.identity(point)
        if identity in self._by_identity:
            self.records[point] = {**self._by_identity[identity], "bisect_step_s": 0.0, "same_as_earlier": True}
            return self.records[point]
        started = time.perf_counter()
        try:
            cell = self.axis.cell(self.cell, point)
            resolved = self.environments.for_cell(cell)
        except EnvironmentUnavailable as exc:
            cell, resolved = dataclasses.replace(self.cell, name=f"{self.cell.name}@{point}"), Resolved(None, exc.reason)
        env = resolved.env
        if env is not None and not env.reused:
            self.environments_built += 1
        pins = self.axis.pins(point) if env is not None else ()
        item = PlannedItem(
            cell, self.opts.repro, self.repro.module, self.opts.mode, self.repro.spec.world_size or cell.world_size
        )
        record = observe_item(
            run_id=self.run_id,
            item=item,
            repro=self.repro,
            resolved=resolved,
            run_dir=self.run_dir,
            launcher=self.launcher,
            repro_cmd=run_command(
                self.opts.matrix.path,
                cell,
                self.opts.repro,
                self.opts.mode,
                pins,
                self.opts.cache_dir,
                self.opts.repros_dirs,
                module=self.repro.module,
            ),
            environments=self.environments,
        )
        record["bisect_point"] = point
        record["bisect_step_s"] = round(time.perf_counter() - started, 3)
        self.writer.append(record)
        self.records[point] = self._by_identity[identity] = record
        return record

    def report_step(self, point: str, state: State, role: str) -> None:
        rec = self.records[point]
        env = rec.get("env") or {}
        if rec.get("same_as_earlier"):
            how = "same resolution as an earlier step, not run again"
        elif not env:
            how = "no environment"
        else:
            how = "environment reused" if env.get("reused") else f"environment built {env.get('build_s', 0):.0f}s"
        step = {
            "n": len(self.steps) + 1,
            "role": role,
            "point": point,
            "outcome": rec["outcome"],
            "signature": rec.get("signature"),
            "state": state,
            "seconds": rec["bisect_step_s"],
            "environment": how,
            "env_key": env.get("key"),
            "error": rec.get("error"),
        }
        self.steps.append(step)
        sig = f" [{step['signature']}]" if step["signature"] else ""
        self.console.print(
            f"step {step['n']} ({role}): {self.axis.label(point)} → {rec['outcome']}{sig} = {state} "
            f"({step['seconds']:.1f}s, {how})",
            highlight=False,
            markup=False,  # "[F1.recompute-shape-0]" is a signature, not a style
        )


def unknown_points(axis: VersionAxis | DateAxis, result: SearchResult[str], records: dict[str, ItemRecord]) -> str:
    """``; A and B failed differently (ImportError); C could not run (INFRA)`` for the final line."""

    def how(point: str) -> str:
        record = records.get(point) or {}
        error = (record.get("error") or {}).get("type")  # type: ignore[union-attr]
        return str(error or record.get("outcome") or "?")

    parts = []
    for points, what in ((result.others, "failed differently"), (result.skipped, "could not run")):
        if points:
            names = [axis.label(p) for p in points]
            joined = ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else names[0]
            kinds = ", ".join(sorted({how(p) for p in points}))
            parts.append(f"{joined} {what} ({kinds})")
    return "".join(f"; {part}" for part in parts)


def final_line(package: str, result: SearchResult[str]) -> str:
    word = "first bad" if result.kind == "regression" else "first good"
    if result.status == FOUND:
        return f"{word}: {package}=={result.boundary}"
    if result.status == "ambiguous":
        unknown = ", ".join([*result.skipped, *result.others])
        candidates = ", ".join(f"{package}=={v}" for v in result.candidates)
        return f"{word}: ambiguous, one of {candidates} (no verdict on: {unknown})"
    if result.status == "non-monotonic":
        evidence = ", ".join(f"{p.point} {p.state}" for p in result.contradictions)
        return f"{word}: none, the history is not monotonic ({evidence})"
    if result.status == "endpoints-agree":
        return f"{word}: none, the endpoints do not differ"
    return f"{word}: none, an endpoint could not be observed"


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
    if opts.repro not in opts.discovery.repros:
        raise UserError("--repro", opts.repro, "unknown repro", unknown_repro_fix(opts.repro, opts.discovery.repros))
    modes = opts.discovery.repros[opts.repro].spec.modes
    if opts.mode not in modes:
        raise UserError("--mode", opts.mode, f"{opts.repro} has no such mode", f"use one of: {', '.join(modes)}")
    cell = base_cell(opts.matrix, opts.cell)
    environments = Environments(opts.cache_dir)
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
        # The endpoints first: what each showed defines "bad" and "good" for every step.
        bad_signature = signature_of(steps.record(bad))
        good_signature = signature_of(steps.record(good))

        def probe(point: str, role: str) -> State:
            state = state_of(steps.record(point), bad_signature, good_signature)
            steps.report_step(point, state, role)
            return state

        result = search(points, probe, verify=opts.verify)
        final = axis.final(result) + unknown_points(axis, result, steps.records)
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
        "steps": steps.steps,
        "environments_built": steps.environments_built,
        "wall_s": round(time.perf_counter() - started, 3),
        "host": host_info(),
        "final": final,
    }
    tmp = out / f"{BISECT_FILE}.tmp"
    tmp.write_text(json.dumps(summary, indent=1, default=str))
    os.replace(tmp, out / BISECT_FILE)
    console.print(
        f"{len(steps.steps)} steps, {steps.environments_built} environments built, {summary['wall_s']:.0f}s; "
        f"steps in {out / BISECT_FILE}",
        highlight=False,
    )
    print(final, flush=True)
    return 0 if result.status == FOUND else 1
