"""``python -m harness bisect``: which release of a package changed a repro's outcome.

The base cell's packages stay as they are; the bisected package is pinned to each
released version between the endpoints in turn. Both endpoints are run first. "Bad"
means what the bad endpoint showed (the same outcome and signature id), not any
failure; a step whose environment cannot be built, or that ends INFRA or HANG, is
skipped. Environments come from the shared cache, so a rerun builds nothing new.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version
from rich.console import Console

from harness.bisect_search import FOUND, SearchResult, State, search
from harness.environments import Environment, EnvironmentUnavailable, UvEnvironments
from harness.errors import UserError
from harness.matrix import Cell, Matrix
from harness.package_index import pip_index_config
from harness.package_versions import VersionsUnavailable, between, released_versions
from harness.repro_registry import Discovery
from harness.results import RESULTS_FILE, ResultsWriter
from harness.runner import (
    PlannedItem,
    environment_for,
    host_info,
    new_run_id,
    observe_item,
    pinned_cell,
    run_command,
)

SKIPPED_OUTCOMES = ("UNRESOLVABLE", "INFRA", "HANG")
BISECT_FILE = "bisect.json"


@dataclass(frozen=True)
class BisectOptions:
    matrix: Matrix
    discovery: Discovery
    repro: str
    mode: str
    package: str
    good: str
    bad: str
    cache_dir: Path
    cell: str | None = None
    out_dir: Path | None = None
    reports_dir: Path = Path("reports")
    pre: bool = False
    verify: int = 0


def signature_of(record: dict[str, Any]) -> tuple[str, str | None]:
    return record["outcome"], record.get("signature")


def state_of(record: dict[str, Any], bad: tuple[str, str | None]) -> State:
    if record["outcome"] in SKIPPED_OUTCOMES:
        return "skip"
    return "bad" if signature_of(record) == bad else "good"


def base_cell(matrix: Matrix, name: str | None) -> Cell:
    if name is not None:
        if name not in matrix.cells:
            raise UserError(matrix.path, "--cell", f"no cell named {name!r}", f"use one of: {', '.join(matrix.cells)}")
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
    """Builds (or reuses) the environment for one version and runs the item there."""

    def __init__(
        self, opts: BisectOptions, cell: Cell, out: Path, run_id: str, writer: ResultsWriter, console: Console
    ) -> None:
        self.opts = opts
        self.cell = cell
        self.out = out
        self.run_id = run_id
        self.writer = writer
        self.console = console
        self.builder = UvEnvironments(opts.cache_dir, pip_index_config())
        self.repro = opts.discovery.repros[opts.repro]
        self.records: dict[str, dict[str, Any]] = {}
        self.steps: list[dict[str, Any]] = []
        self.environments_built = 0

    def pins(self, version: str) -> tuple[tuple[str, str], ...]:
        return ((self.opts.package, f"=={version}"),)

    def record(self, version: str) -> dict[str, Any]:
        if version in self.records:
            return self.records[version]
        cell = pinned_cell(self.cell, self.pins(version))
        item = PlannedItem(
            cell, self.opts.repro, self.repro.module, self.opts.mode, self.repro.spec.world_size or cell.world_size
        )
        started = time.perf_counter()
        env: Environment | None = None
        reason = ""
        try:
            env = environment_for(cell, self.builder, self.opts.cache_dir)
        except EnvironmentUnavailable as exc:
            reason = exc.reason
        if env is not None and not env.reused:
            self.environments_built += 1
        record = observe_item(
            run_id=self.run_id,
            item=item,
            repro=self.repro,
            env=env,
            unavailable_reason=reason,
            out=self.out,
            repro_cmd=run_command(
                self.opts.matrix.path, cell, self.opts.repro, self.opts.mode, self.pins(version), self.opts.cache_dir
            ),
        )
        record["bisect_step_s"] = round(time.perf_counter() - started, 3)
        self.writer.append(record)
        self.records[version] = record
        return record

    def report_step(self, version: str, state: State, role: str) -> None:
        rec = self.records[version]
        env = rec.get("env") or {}
        how = (
            "no environment" if not env else ("reused" if env.get("reused") else f"built {env.get('build_s', 0):.0f}s")
        )
        step = {
            "n": len(self.steps) + 1,
            "role": role,
            "version": version,
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
            f"step {step['n']} ({role}): {self.opts.package}=={version} → {rec['outcome']}{sig} = {state} "
            f"({step['seconds']:.1f}s, environment {how})",
            highlight=False,
        )


def final_line(package: str, result: SearchResult[str]) -> str:
    word = "first bad" if result.kind == "regression" else "first good"
    if result.status == FOUND:
        return f"{word}: {package}=={result.boundary}"
    if result.status == "ambiguous":
        skipped = ", ".join(result.skipped)
        candidates = ", ".join(f"{package}=={v}" for v in result.candidates)
        return f"{word}: ambiguous, one of {candidates} (could not observe: {skipped})"
    if result.status == "non-monotonic":
        evidence = ", ".join(f"{p.point} {p.state}" for p in result.contradictions)
        return f"{word}: none, the history is not monotonic ({evidence})"
    if result.status == "endpoints-agree":
        return f"{word}: none, the endpoints do not differ"
    return f"{word}: none, an endpoint could not be observed"


def execute_bisect(opts: BisectOptions, console: Console) -> int:
    if opts.repro not in opts.discovery.repros:
        raise UserError(
            "--repro", opts.repro, "unknown repro", f"use one of: {', '.join(sorted(opts.discovery.repros))}"
        )
    modes = opts.discovery.repros[opts.repro].spec.modes
    if opts.mode not in modes:
        raise UserError("--mode", opts.mode, f"{opts.repro} has no such mode", f"use one of: {', '.join(modes)}")
    cell = base_cell(opts.matrix, opts.cell)
    points = [str(v) for v in bisect_points(opts)]
    run_id = new_run_id()
    out = opts.out_dir or (opts.reports_dir / f"bisect-{run_id}")
    out.mkdir(parents=True, exist_ok=True)
    if (out / RESULTS_FILE).exists():
        raise UserError(out, RESULTS_FILE, "already holds results", "choose a new --out directory")
    good, bad = str(Version(opts.good)), str(Version(opts.bad))
    console.print(
        f"bisect {opts.repro}/{opts.mode} over {opts.package} {points[0]} … {points[-1]} "
        f"({len(points)} releases) in cell {cell.name}; good {good}, bad {bad}",
        highlight=False,
    )
    started = time.perf_counter()
    with ResultsWriter(out / RESULTS_FILE) as writer:
        steps = StepRunner(opts, cell, out, run_id, writer, console)
        # The bad endpoint first: its outcome and signature define "bad" for every step.
        bad_signature = signature_of(steps.record(bad))

        def probe(version: str, role: str) -> State:
            state = state_of(steps.record(version), bad_signature)
            steps.report_step(version, state, role)
            return state

        result = search(points, probe, verify=opts.verify)
    summary = {
        "run_id": run_id,
        "repro": opts.repro,
        "mode": opts.mode,
        "package": opts.package,
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
        "contradictions": [dataclasses.asdict(p) for p in result.contradictions],
        "steps": steps.steps,
        "environments_built": steps.environments_built,
        "wall_s": round(time.perf_counter() - started, 3),
        "host": host_info(),
        "final": final_line(opts.package, result),
    }
    tmp = out / f"{BISECT_FILE}.tmp"
    tmp.write_text(json.dumps(summary, indent=1, default=str))
    os.replace(tmp, out / BISECT_FILE)
    console.print(
        f"{len(steps.steps)} steps, {steps.environments_built} environments built, {summary['wall_s']:.0f}s; "
        f"steps in {out / BISECT_FILE}",
        highlight=False,
    )
    print(summary["final"], flush=True)
    return 0 if result.status == FOUND else 1
