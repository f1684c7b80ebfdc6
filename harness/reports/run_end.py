"""How ``run`` ends on the terminal: the summary table, what a run that built environments cost
(``run_cost.py``), what each explored repro did in each cell, and how to keep those observations
(``--save-expectations``, which ``analysis/explore/save.py`` does once this is said)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich.console import Console

from harness.core.text import plain
from harness.records.item import ItemRecord
from harness.records.run_meta import CellMeta, ExcludedItem
from harness.reports.findings import findings_lines
from harness.reports.run_cost import RunCost
from harness.reports.terminal import print_summary


def print_run_end(
    console: Console,
    records: Sequence[ItemRecord],
    cells: Mapping[str, CellMeta],
    excluded: Sequence[ExcludedItem],
    saving: bool,
    cost: RunCost | None = None,
) -> None:
    """The summary of a finished run; ``saving``: its observations are about to be kept as expectations;
    ``cost``: what it cost, said where it built environments (a first run)."""
    print_summary(console, records, excluded)
    if cost is not None and cost.environments_built:
        for line in cost.lines():
            console.print(plain(line), highlight=False, markup=False)
    explored = findings_lines(records, cells)
    for line in explored:
        console.print(plain(line), highlight=False, markup=False)
    if explored and not saving:
        console.print(
            "keep them as expectations: the same command with --save-expectations (it saves what this run "
            "observed: nothing runs again)",
            highlight=False,
            markup=False,
        )
