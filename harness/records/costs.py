"""``costs.json``: what ``costs`` measured, one entry per repro x variant x cell (``CostEntry``),
with the run it came from (``CostsFile``); written whole (a temporary file, then renamed) and read
back validated. ``explain`` and the atlas read it; ``harness/reports/cost_table.py`` prices and
shows the entries."""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness.core.errors import UserError
from harness.core.json import JsonValue
from harness.core.user_files import read_named_text
from harness.records.item import validation_problem
from repros.runtime.outcomes import Outcome

COSTS_FILE = "costs.json"


class Pricing(BaseModel):
    """An entry's figures as multiples of another's, or why it is not priced."""

    model_config = ConfigDict(frozen=True)

    train_peak_mem_delta_bytes: float | None = None
    train_peak_mem_ratio: float | None = None
    step_cpu_time_s_ratio: float | None = None
    step_time_s_ratio: float | None = None
    #: Twice the larger interquartile range of CPU time per step, over the base's median.
    step_cpu_noise_ratio: float | None = None
    why_not: str | None = None


class Spread(BaseModel):
    """Run to run, over the rounds: (max - min) / median."""

    model_config = ConfigDict(frozen=True)

    train_peak_mem: float | None = None
    step_cpu_time: float | None = None
    step_time: float | None = None


class CostEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow")

    repro: str
    variant: str
    cell: str
    description: str = ""
    claim: str = ""
    overrides: dict[str, JsonValue] = Field(default_factory=dict)
    #: The outcome most rounds had, and every round's.
    outcome: Outcome
    outcomes: list[Outcome] = Field(default_factory=list)
    signature: str | None = None
    reasons: list[str] = Field(default_factory=list)
    model: str | None = None
    versions: dict[str, str | None] = Field(default_factory=dict)
    rounds: int = 1
    train_peak_mem_bytes: float | None = None
    train_peak_mem_kind: str | None = None
    step_cpu_time_s: float | None = None
    step_time_s: float | None = None
    step_cpu_iqr_s: float | None = None
    spread: Spread = Field(default_factory=Spread)
    against_documented: Pricing | None = None
    against_fixed_trainer: Pricing | None = None


class CostsFile(BaseModel):
    """``costs.json``: the run (when, the command, the model, how far it got) and its entries."""

    model_config = ConfigDict(frozen=True, extra="allow")

    started_at: str | None = None
    finished_at: str | None = None
    argv: list[str] = Field(default_factory=list)
    model: str | None = None
    rounds: int | None = None
    interrupted: str | None = None
    planned_items: int | None = None
    ran_items: int | None = None
    entries: list[CostEntry]


#: The largest ``costs.json`` read (one entry per item and workaround: kilobytes each).
MAX_COSTS_BYTES = 64 * 2**20


def write_costs(path: Path, costs: CostsFile) -> Path:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(costs.model_dump(mode="json"), indent=1), encoding="utf-8")
    os.replace(tmp, path)
    return path


def read_costs(path: Path) -> list[CostEntry]:
    """The entries of a ``costs.json``; a ``UserError`` naming the file where it is not one."""
    text = read_named_text(
        path, "", "pass the costs.json a 'costs' run wrote", limit=MAX_COSTS_BYTES, what="a costs table"
    )
    try:
        return CostsFile.model_validate_json(text).entries
    except ValidationError as exc:
        raise UserError(
            path, "", f"is not a costs table: {validation_problem(exc)}", "pass the costs.json a 'costs' run wrote"
        ) from None


def newest_costs(reports_dir: Path) -> Path | None:
    """The newest ``costs.json`` in a run directory of ``reports_dir`` (where ``costs`` writes them)."""
    found = [p for p in Path(reports_dir).glob(f"*/{COSTS_FILE}") if p.is_file()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None
