"""The config grid, run: every combination as users write it in every selected cell, each judged
by the grid's rules (a combination no rule covers is a finding, reported, not failed), each known
failure run again through the fixed trainer's guards, and the combinations that trained in the
previous grid run and do not now named as regressions."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from rich.console import Console

from harness.config.grid import Grid
from harness.config.repros import Repro
from harness.core.errors import EXIT_USAGE, UserError
from harness.core.json import JsonValue
from harness.core.text import plain
from harness.pipeline.dispatch import ItemPolicy
from harness.pipeline.session import EXIT_INTERRUPTED, RunSession
from harness.planning.grid import AS_WRITTEN, GRID_MODULE, GUARDED, combinations, planned, restrict
from harness.planning.items import Plan, PlannedItem, selected_cells
from harness.planning.run_options import RunOptions, check_families
from harness.records.item import ItemRecord
from harness.records.run_dir import RunDir
from harness.records.run_meta import RunMeta
from harness.reports.grid_tables import print_grid
from repros.runtime.families import DEFAULT_FAMILY
from repros.runtime.outcomes import Outcome
from repros.trainer import scenario_item

#: What every grid item runs: the scenario item, classified against every repro's signatures.
GRID_REPRO = Repro(spec=scenario_item.SPEC, module=GRID_MODULE)


def guarded_follow_up(item: PlannedItem, record: ItemRecord) -> list[PlannedItem]:
    """A known failure, as users wrote it: run it again through the fixed trainer's guards."""
    if item.mode != AS_WRITTEN or record.outcome != Outcome.REPRODUCED:
        return []
    return [
        PlannedItem(
            item.cell, item.repro_id, item.module, GUARDED, item.world_size, scenario=item.scenario, rank_mode="fixed"
        )
    ]


def annotate(grid: Grid, record: ItemRecord) -> ItemRecord:
    """The record with its expectation from the grid's rules (a combination none covers: a finding)."""
    combination = record.scenario or {}
    if record.mode != AS_WRITTEN or not combination:
        # A guarded rerun answers "does it train then?": a finding.
        return record.evolve(explored=True) if combination else record
    rule = grid.expectation(combination, record.versions, record.device, record.family)
    if rule is None:
        return record.evolve(explored=True)  # reported, not failed: what it did is the finding
    device = {"expected_device": rule.device} if rule.device else {}
    family = {"family": ",".join(rule.families)} if rule.families else {}
    return record.evolve(
        expected=rule.outcome,
        expected_established_by=rule.established_by,
        expected_when={**{a: ",".join(v) for a, v in rule.match.items()}, **rule.versions, **family},
        matched=record.outcome == rule.outcome and rule.names(record.signature),
        **device,
    )


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
        if meta.kind == "grid" and meta.finished_at:
            candidates.append((meta.started_at or "", run))
    return max(candidates, key=lambda c: c[0])[1] if candidates else None


def regressions(previous: Sequence[ItemRecord], current: Sequence[ItemRecord]) -> list[str]:
    """Combinations that trained in the previous run and do not now (same cell, same model)."""
    before = {(*r.key, r.model): r.outcome for r in previous if r.scenario}
    found = []
    for r in current:
        if r.scenario and before.get((*r.key, r.model)) == Outcome.PASS and r.outcome != Outcome.PASS:
            found.append(f"{r.id.label()}: PASS → {r.outcome}")
    return found


def family_restriction(only: Sequence[str]) -> tuple[list[str], list[str]]:
    """``--only family=F1,F2`` is not an axis of the combinations but of the cells: each selected cell
    runs in those families (as ``--family``). The other restrictions, and the families named."""
    rest: list[str] = []
    families: list[str] = []
    for text in only:
        axis, _, values = text.partition("=")
        if axis.strip() != "family":
            rest.append(text)
            continue
        families += check_families("--only family=", [v.strip() for v in values.split(",") if v.strip()])
        if not values.strip():
            raise UserError("--only", text, "names no family", f"write it like --only family={DEFAULT_FAMILY},llama")
    return rest, families


def run_grid(opts: RunOptions, only: Sequence[str], out: Path, console: Console, argv: Sequence[str]) -> int:
    """Run the grid's combinations in the selected cells; exit 1 where an expectation did not hold
    or a combination regressed against the previous grid run beside this one."""
    grid = opts.matrix.grid
    if grid is None:
        raise UserError(opts.matrix.path, "grid", "the matrix declares no grid", "add a 'grid:' section (see the docs)")
    lane = opts.selection.lane or (None if opts.selection.cells else opts.matrix.default_lane)
    coverage = grid.coverage.get(lane or "", "pairwise")
    only, families = family_restriction(only)
    if families:
        every = tuple(dict.fromkeys((*opts.stack.families, *families)))
        opts = dataclasses.replace(opts, stack=opts.stack.evolve(families=every))
    combos = combinations(grid, coverage, restrict(grid, only))
    cells = selected_cells(opts)
    plan = Plan(items=planned(cells, combos))
    if not plan.items:
        raise UserError("--only", " ".join(only) or "(none)", "leaves no combination", "widen the selection")
    console.print(
        f"grid: {len(combos)} combinations ({coverage}) x {len(cells)} cells = {len(plan.items)} items", highlight=False
    )
    started = time.perf_counter()
    found: dict[str, list[str]] = {"mismatched": [], "regressed": []}

    def ended(records: Sequence[ItemRecord], meta: RunMeta, interrupted: bool) -> Mapping[str, JsonValue]:
        wall = time.perf_counter() - started
        print_grid(console, records)
        previous = previous_grid_run(out.parent, out)  # the runs kept beside this one
        regressed = regressions(previous.records(), records) if previous is not None else []
        mismatched = [r for r in records if r.expected and not r.matched]
        console.print(
            f"{len(records)} items ({len(plan.items)} planned, {len(records) - len(plan.items)} run again through the "
            f"guards) in {wall:.0f} s: {60 * len(records) / wall:.1f} items a minute",
            highlight=False,
        )
        for r in mismatched:
            console.print(
                plain(f"✗ {r.cell}/{r.repro}: observed {r.outcome} {r.signature or ''}, expected {r.expected}"),
                highlight=False,
                markup=False,
            )
            found["mismatched"].append(r.id.label())
        for line in regressed:
            console.print(
                plain(f"✗ regressed since {previous.path.name if previous else '?'}: {line}"),
                highlight=False,
                markup=False,
            )
            found["regressed"].append(line)
        return {
            "grid": {
                "coverage": coverage,
                "combinations": len(combos),
                "cells": [c.name for c in cells],
                "items": len(records),
                "wall_s": round(wall, 1),
                "items_per_minute": round(60 * len(records) / wall, 2) if wall else None,
                "regressions": regressed,
                "previous": str(previous.path) if previous else None,
            }
        }

    policy = ItemPolicy(
        repro_for=lambda item: GRID_REPRO, annotate=lambda r: annotate(grid, r), follow_ups=guarded_follow_up
    )
    session = RunSession(
        dataclasses.replace(opts, out_dir=out),
        console,
        argv,
        None,
        plan=plan,
        kind="grid",
        policy=policy,
        on_finished=ended,
    )
    status = session.execute()
    if status in (EXIT_INTERRUPTED, EXIT_USAGE):
        return status  # the run said what was not run and how to resume
    return 1 if found["mismatched"] or found["regressed"] else 0
