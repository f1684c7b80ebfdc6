"""``run --save-expectations``: what a run observed, written back as each repro's expectations.

Per repro, the observations become expectations pinned to the versions observed
(``harness.reports.findings.derive_expectations``), each with the command that established it; they go
first, before the repro's own expectations that none of the observed versions satisfy. A script
repro's declaration file is edited (``harness.analysis.explore.declaration``); a repro that declares its
expectations in code gets the ``Expectation(...)`` lines to paste.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from harness.analysis.explore.declaration import merge, paste_lines, write_expectations
from harness.config.repros import Discovery
from harness.planning.commands import selection_command
from harness.planning.run_options import RunOptions
from harness.records.item import ItemRecord
from harness.reports.findings import CellsMeta, derive_expectations
from repros.runtime.kinds.script import PARAM


def save_observed(
    records: Sequence[ItemRecord],
    cells_meta: CellsMeta,
    discovery: Discovery,
    established_by: Callable[[str, list[str]], str],
    say: Callable[[str], None],
) -> list[Path]:
    """Save each observed repro's expectations; return the files written."""
    written: list[Path] = []
    for repro_id in dict.fromkeys(r.repro for r in records):
        repro = discovery.repros.get(repro_id)
        if repro is None:
            continue
        own = [r for r in records if r.repro == repro_id and not r.variant and not r.scenario]
        cells = list(dict.fromkeys(r.cell_origin or r.cell for r in own))
        derived = derive_expectations(own, cells_meta, established_by(repro_id, cells))
        for why in derived.skipped:
            say(f"{repro_id}: {why}")
        if not derived.expectations:
            say(f"{repro_id}: nothing observed to save")
            continue
        declared = repro.rank_params.get(PARAM)
        if isinstance(declared, dict) and declared.get("file"):
            path = Path(declared["file"])
            merged = merge(repro.spec.expectations, derived.expectations, derived.observed_versions)
            how = write_expectations(path, merged)
            say(f"{repro_id}: {len(derived.expectations)} expectations saved to {path} ({how})")
            written.append(path)
        else:
            say(f"{repro_id} declares its expectations in code ({repro.module}); add these to its SPEC.expectations:")
            for line in paste_lines(derived.expectations):
                say(f"    {line}")
    return written


def save_run(
    opts: RunOptions, records: Sequence[ItemRecord], cells_meta: CellsMeta, say: Callable[[str], None]
) -> None:
    """``run --save-expectations``, once the run is over: each repro's expectations established by the
    command that explores its cells again, as this run did."""

    def established_by(repro: str, cells: list[str]) -> str:
        return selection_command(opts, cells, [repro])

    save_observed(records, cells_meta, opts.discovery, established_by, say)
