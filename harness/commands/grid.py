"""``grid``: every combination of the config grid, as users write it, in the selected cells."""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path

from rich.console import Console

from harness import options
from harness.commands.base import Command
from harness.dispatch import ItemPolicy
from harness.errors import EXIT_USAGE, UserError
from harness.grid import (
    GRID_MODULE,
    annotate,
    combinations,
    guarded_follow_up,
    planned,
    restrict,
)
from harness.grid_report import print_grid
from harness.pipeline import EXIT_INTERRUPTED, RunSession, new_run_id
from harness.planning import Plan, selected_cells
from harness.records import ItemRecord
from harness.repro_registry import Repro
from harness.run_dir import RunDir
from harness.terminal import plain
from repros.common import scenario_item

GRID_REPRO = Repro(spec=scenario_item.SPEC, module=GRID_MODULE)


def previous_grid_run(reports_dir: Path, current: Path) -> RunDir | None:
    """The newest earlier grid run beside this one (what a regression is measured against)."""
    candidates = []
    try:
        siblings = [p for p in reports_dir.iterdir() if p.is_dir() and p.resolve() != current.resolve()]
    except OSError:
        return None
    for directory in siblings:
        run = RunDir(directory)
        try:
            meta = run.read_meta()
        except UserError:
            continue
        if meta.get("kind") == "grid" and meta.get("finished_at"):
            candidates.append((str(meta.get("started_at")), run))
    return max(candidates, key=lambda c: c[0])[1] if candidates else None


def regressions(previous: Sequence[ItemRecord], current: Sequence[ItemRecord]) -> list[str]:
    """Combinations that trained in the previous run and do not now (same cell, same model)."""
    before = {(r["cell"], r["repro"], r["mode"], r.get("model")): r["outcome"] for r in previous if r.get("scenario")}
    found = []
    for r in current:
        key = (r["cell"], r["repro"], r["mode"], r.get("model"))
        if r.get("scenario") and before.get(key) == "PASS" and r["outcome"] != "PASS":
            found.append(f"{r['cell']}/{r['repro']}/{r['mode']}: PASS → {r['outcome']}")
    return found


class GridCommand(Command):
    name = "grid"
    help = "run every combination of the config grid as users write it, in the selected cells, and classify it"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        options.add_cli_options(parser, ("matrix", "lane", "cells"))
        parser.add_argument("--only", action="append", default=[], metavar="AXIS=V1,V2",
                            help="restrict an axis to these values (repeatable)")
        options.add_cli_options(parser, ("model", "out", "jobs", "reports_dir", "cache_dir", "launcher"))

    def run(self, args: argparse.Namespace, console: Console, argv: Sequence[str]) -> int:
        opts = options.selection(vars(args))
        grid = opts.matrix.grid
        if grid is None:
            raise UserError(opts.matrix.path, "grid", "the matrix declares no grid", "add a 'grid:' section (see the README)")
        lane = opts.lane or (None if opts.cells else opts.matrix.default_lane)
        coverage = grid.coverage.get(lane or "", "pairwise")
        combos = combinations(grid, coverage, restrict(grid, args.only))
        cells = selected_cells(opts)
        plan = Plan(items=planned(cells, combos))
        if not plan.items:
            raise UserError("--only", " ".join(args.only) or "(none)", "leaves no combination", "widen the selection")
        out = Path(args.out or opts.reports_dir / f"grid-{new_run_id()}")
        opts = dataclasses.replace(opts, out_dir=out)
        console.print(
            f"grid: {len(combos)} combinations ({coverage}) x {len(cells)} cells = {len(plan.items)} items", highlight=False
        )
        policy = ItemPolicy(
            repro_for=lambda item: GRID_REPRO,
            annotate=partial(annotate, grid),
            follow_ups=guarded_follow_up,
        )
        started = time.perf_counter()
        status = RunSession(opts, console, argv, None, plan=plan, kind="grid", policy=policy).execute()
        wall = time.perf_counter() - started
        run_dir = RunDir(out)
        records = run_dir.records()
        print_grid(console, records)
        meta = run_dir.read_meta()
        meta["grid"] = {"coverage": coverage, "combinations": len(combos), "cells": [c.name for c in cells],
                        "items": len(records), "wall_s": round(wall, 1),
                        "items_per_minute": round(60 * len(records) / wall, 2) if wall else None}
        mismatched = [r for r in records if r.get("expected") and not r.get("matched")]
        previous = previous_grid_run(out.parent, out)  # the runs kept beside this one
        regressed = regressions(previous.records(), records) if previous is not None else []
        meta["grid"]["regressions"] = regressed
        meta["grid"]["previous"] = str(previous.path) if previous else None
        run_dir.write_meta(meta)
        console.print(
            f"{len(records)} items ({len(plan.items)} planned, {len(records) - len(plan.items)} run again through the "
            f"guards) in {wall:.0f} s: {60 * len(records) / wall:.1f} items a minute", highlight=False,
        )
        for r in mismatched:
            console.print(plain(f"✗ {r['cell']}/{r['repro']}: observed {r['outcome']} {r.get('signature') or ''}, "
                                f"expected {r['expected']}"), highlight=False, markup=False)
        for line in regressed:
            console.print(plain(f"✗ regressed since {previous.path.name}: {line}"), highlight=False, markup=False)  # type: ignore[union-attr]
        if status in (EXIT_INTERRUPTED, EXIT_USAGE):
            return status  # the run said what was not run and how to resume
        return 1 if mismatched or regressed else 0



