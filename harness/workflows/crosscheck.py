"""``crosscheck``, run: every selected strategy in every selected cell held against one process training the
same adapter on the same global batch. Each (cell, strategy) is an item; its record says AGREES or DIVERGES
(where, which quantity, which tensor, both values, the relative difference and the tolerance), names the
documented failure that explains a divergence, and counts against the run where a divergence is not one a
documented failure expects there (a finding: the smallest strategy that shows it, and one command that reruns
it, are printed)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

from rich.console import Console

from harness.core.errors import UserError
from harness.core.json import JsonValue
from harness.pipeline.dispatch import ItemPolicy
from harness.pipeline.session import RunSession
from harness.planning.crosscheck import planned, run_lane, select
from harness.planning.items import Plan, selected_cells
from harness.planning.run_options import RunOptions
from harness.records.item import ItemRecord
from harness.records.run_meta import RunMeta
from harness.reports.crosscheck_table import findings, print_crosscheck
from repros.trainer.crosscheck.training import Breakage


@dataclasses.dataclass(frozen=True)
class CrosscheckRequest:
    """What ``crosscheck`` was asked beyond the run's options."""

    strategies: tuple[str, ...] = ()
    steps: int | None = None
    seed: int = 0
    breakage: str | None = None
    list_only: bool = False


def item_params(opts: RunOptions, request: CrosscheckRequest) -> dict[str, JsonValue]:
    steps = request.steps or opts.matrix.crosscheck.steps
    if steps < 1:
        raise UserError("--steps", str(steps), "trains nothing", "give at least 1 (2 or more compares a step's effect)")
    if request.breakage is not None and request.breakage not in Breakage.KINDS:
        raise UserError("--break", request.breakage, "is no kind of fault", f"use one of: {', '.join(Breakage.KINDS)}")
    return {"seed": request.seed, "steps": steps, "break": request.breakage}


def run_crosscheck(
    opts: RunOptions, request: CrosscheckRequest, out: Path, console: Console, argv: Sequence[str]
) -> int:
    lane = run_lane(opts)
    strategies = select(opts.matrix.crosscheck, lane, request.strategies)
    if request.list_only:
        for strategy in strategies:
            console.print(strategy.name, highlight=False, markup=False)
        return 0
    config = opts.matrix.crosscheck
    # A lane's strategies run in the cells its section names (all of the lane's, where it names none); cells named
    # with --cells run whatever the lane.
    cells = [
        c
        for c in selected_cells(opts)
        if opts.selection.cells or config.runs_in(lane, c.origin or c.family_of or c.name)
    ]
    items, excluded = planned(cells, strategies, item_params(opts, request))
    if not items:
        raise UserError(
            "--strategies", " ".join(request.strategies) or "(the lane's)", "leaves no item", "widen the selection"
        )
    plan = Plan(items=items, excluded=excluded)
    broken = (
        f", each with a deliberate fault ({request.breakage}): every item should DIVERGE" if request.breakage else ""
    )
    console.print(
        f"crosscheck: {len(strategies)} strategies x {len(cells)} cells = {len(items)} items"
        f"{f' ({len(excluded)} not offered by their cell)' if excluded else ''}{broken}",
        highlight=False,
    )

    def annotate(record: ItemRecord) -> ItemRecord:
        if request.breakage is None:
            return record
        # A deliberate fault must be caught: DIVERGES is what proves the comparison, anything else does not.
        return record.evolve(
            expected="DIVERGES",
            expected_established_by=f"--break {request.breakage}: the strategy was broken on purpose",
            matched=record.outcome == "DIVERGES",
        )

    def ended(records: Sequence[ItemRecord], meta: RunMeta, interrupted: bool) -> Mapping[str, JsonValue]:
        print_crosscheck(console, records)
        found = findings(records)
        return {"crosscheck": {"strategies": [s.name for s in strategies], "findings": found}}

    policy = ItemPolicy(annotate=annotate)
    session = RunSession(
        dataclasses.replace(opts, out_dir=out),
        console,
        argv,
        None,
        plan=plan,
        kind="crosscheck",
        policy=policy,
        on_finished=ended,
    )
    return session.execute()
