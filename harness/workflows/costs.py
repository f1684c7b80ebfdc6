"""``costs``: what every workaround the field recommends costs, and whether it trains at all.

For each selected repro in each selected cell, the documented scenario runs as users wrote it
(``as-documented``), through the fixed trainer's guards (``fixed-trainer``), and as each variant
the repro declares (``SPEC.variants``: ZeRO-2 instead of ZeRO-3, checkpointing off, reentrant
checkpointing...), at the ``small`` model by default. Each is classified as users would meet it
(PASS, a known failure by signature, SILENT_FAILURE, NEW_FAILURE...) and measured: the training's
peak memory above its baseline, CPU and wall time per step. Where the documented scenario runs
clean in a cell, every variant there is priced against it, with the noise: twice the larger
step-time IQR, and with several rounds the run-to-run spread. A claim in the field that does not
hold (ZeRO-2 does not avoid F3's refusal) shows as the variant's outcome.

``costs.json`` keeps one entry per repro x variant x cell (``harness/records/costs.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from harness.core.errors import EXIT_USAGE, UserError
from harness.core.text import plain
from harness.pipeline.session import EXIT_INTERRUPTED, RunSession
from harness.planning.items import Plan, PlannedItem, plan_items
from harness.planning.run_options import RunOptions
from harness.records.costs import COSTS_FILE, CostsFile, write_costs
from harness.records.item import ItemRecord
from harness.records.run_dir import RunDir
from harness.records.run_meta import utc_now
from harness.reports.cost_table import costs_table, entries
from repros.runtime.outcomes import UNOBSERVED, Outcome
from repros.runtime.spec import FIXED_TRAINER


def plan_costs(opts: RunOptions, variants: Sequence[str] = ()) -> Plan:
    """Every variant (or those named) of every selected repro in every selected cell (the cells
    and excludes of the repros' ``bug`` mode)."""
    base = plan_items(dataclasses.replace(opts, selection=opts.selection.evolve(modes=("bug",))))
    plan = Plan(excluded=base.excluded, broken=base.broken)
    known = {name for item in base.items for name in opts.discovery.repros[item.repro_id].spec.variant_names()}
    for wanted in variants:
        if wanted not in known:
            raise UserError(
                "--variants", wanted, "no selected repro has this variant", f"use one of: {', '.join(sorted(known))}"
            )
    for item in base.items:
        spec = opts.discovery.repros[item.repro_id].spec
        for name in spec.variant_names():
            if variants and name not in variants:
                continue
            plan.items.append(
                PlannedItem(
                    item.cell,
                    item.repro_id,
                    item.module,
                    name,
                    item.world_size,
                    variant=name,
                    rank_mode="fixed" if name == FIXED_TRAINER else "bug",
                    explore=True,  # a variant has no expectation: what it does is the finding
                )
            )
    return plan


def run_costs(
    base: RunOptions, variants: Sequence[str], rounds: int, out: Path, console: Console, argv: Sequence[str]
) -> int:
    """Every variant of the selected repros, ``rounds`` times interleaved, priced into ``costs.json``;
    the exit status (1 where something could not be observed, 130 when interrupted)."""
    if (out / COSTS_FILE).exists():
        raise UserError(out, COSTS_FILE, "already holds a costs table", "choose a new --out directory")
    plan = plan_costs(base, variants)
    if not plan.items:
        raise UserError(
            "--repros",
            ",".join(base.selection.repros) or "(all)",
            "plans no item here",
            "pick repros and cells that run together",
        )
    measured: list[list[ItemRecord]] = []
    started = utc_now()
    interrupted: str | None = None
    for number in range(1, rounds + 1):
        opts = dataclasses.replace(base, out_dir=out / f"round-{number}")
        console.print(f"costs: round {number} of {rounds}, {len(plan.items)} items", highlight=False)
        status = RunSession(opts, console, argv, None, plan=plan, kind="costs").execute()
        round_dir = RunDir(out / f"round-{number}")
        measured.append(round_dir.records())
        if status in (EXIT_INTERRUPTED, EXIT_USAGE):
            # What ran is kept and priced; the table says it is partial, and no further round starts.
            interrupted = round_dir.read_meta().interrupted or "a record could not be written"
            break
    found = entries(measured, {k: r.spec for k, r in base.discovery.repros.items()})
    partial = (
        {
            "interrupted": interrupted,
            "planned_items": len(plan.items) * rounds,
            "ran_items": sum(len(r) for r in measured),
        }
        if interrupted
        else {}
    )
    costs = CostsFile(
        started_at=started,
        finished_at=utc_now(),
        argv=list(argv),
        model=base.stack.model,
        rounds=len(measured),
        entries=found,
        **partial,
    )
    path = write_costs(out / COSTS_FILE, costs)
    console.print(costs_table(found))
    for entry in found:
        if entry.claim and entry.outcome != Outcome.PASS:
            console.print(
                plain(
                    f"claim not borne out in {entry.cell}: {entry.repro} {entry.variant} "
                    f"({entry.claim}) ended {entry.outcome}"
                ),
                highlight=False,
                markup=False,
            )
    console.print(f"costs: {path}", highlight=False, markup=False)
    if interrupted:
        console.print(
            f"costs: interrupted ({interrupted}) after {costs.ran_items} of {costs.planned_items} "
            "items: the table holds only what ran",
            highlight=False,
            markup=False,
        )
        return EXIT_INTERRUPTED
    unobserved = [e for e in found if e.outcome in UNOBSERVED or e.outcome == Outcome.CRASH]
    return 1 if unobserved else 0
