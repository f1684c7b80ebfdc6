"""``run --save-expectations``: what a run observed, written back as each repro's expectations.

Per repro, the observations become expectations pinned to the versions observed
(``harness.explore.derive_expectations``), each with the command that established it; they go
first, before the repro's own expectations that none of the observed versions satisfy. A script
repro's declaration file is edited (``harness.declaration_writer``); a repro that declares its
expectations in code gets the ``Expectation(...)`` lines to paste.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.declaration_writer import merge, paste_lines, write_expectations
from harness.explore import derive_expectations
from harness.records import ItemRecord
from harness.repro_registry import Discovery
from repros.common.kinds.script import PARAM
from repros.common.spec import spec_to_data


def save_observed(
    records: Sequence[ItemRecord],
    cells_meta: Mapping[str, Any],
    discovery: Discovery,
    established_by: Callable[[str, list[str]], str],
    say: Callable[[str], None],
) -> list[Path]:
    """Save each observed repro's expectations; return the files written."""
    written: list[Path] = []
    for repro_id in dict.fromkeys(r["repro"] for r in records):
        repro = discovery.repros.get(repro_id)
        if repro is None:
            continue
        own = [r for r in records if r["repro"] == repro_id and not r.get("variant") and not r.get("scenario")]
        cells = list(dict.fromkeys(str(r.get("cell_origin") or r["cell"]) for r in own))
        derived = derive_expectations(own, cells_meta, established_by(repro_id, cells))
        for why in derived.skipped:
            say(f"{repro_id}: {why}")
        if not derived.expectations:
            say(f"{repro_id}: nothing observed to save")
            continue
        declared = repro.rank_params.get(PARAM)
        if isinstance(declared, dict) and declared.get("file"):
            path = Path(declared["file"])
            merged = merge(spec_to_data(repro.spec)["expectations"], derived.expectations, derived.observed_versions)
            how = write_expectations(path, merged)
            say(f"{repro_id}: {len(derived.expectations)} expectations saved to {path} ({how})")
            written.append(path)
        else:
            say(f"{repro_id} declares its expectations in code ({repro.module}); add these to its SPEC.expectations:")
            for line in paste_lines(derived.expectations):
                say(f"    {line}")
    return written
