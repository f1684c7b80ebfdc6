"""How ``run`` ends: the summary table, what each explored repro did in each cell, and with
``--save-expectations`` those observations written back as the repros' expectations."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console

from harness.analysis.explore.findings import findings_lines
from harness.analysis.explore.save import save_observed
from harness.core.text import plain
from harness.pipeline.session import RunEnding
from harness.planning.commands import selection_command
from harness.planning.items import Plan, RunOptions
from harness.records.item import ItemRecord
from harness.records.run_meta import RunMeta
from harness.reports.terminal import print_summary


def run_ending(opts: RunOptions, plan: Plan, console: Console) -> RunEnding:
    def say(text: str) -> None:
        console.print(plain(text), highlight=False, markup=False)

    def ended(records: Sequence[ItemRecord], meta: RunMeta, interrupted: bool) -> None:
        print_summary(console, records, plan.excluded)
        cells_meta = meta.cells
        explored = findings_lines(records, cells_meta)
        for line in explored:
            say(line)
        if explored and not opts.save_expectations:
            say("keep them as expectations: add --save-expectations")
        if opts.save_expectations and not interrupted:

            def established_by(repro: str, cells: list[str]) -> str:
                return selection_command(opts, cells, [repro], "--explore")

            save_observed(records, cells_meta, opts.discovery, established_by, say)

    return ended
