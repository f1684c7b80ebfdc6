"""What one rank recorded (``items/<cell>/<item>/rank<N>.json``), as the orchestrator reads it.

A rank (``repros/runtime/rank_main.py``, standard library only) writes its record when it starts
(``status: running``) and again when it ends (``ok``, ``error`` or ``unavailable``). What a record
holds is declared once, for both sides: ``RankRecord`` and its parts in ``repros/runtime/record.py``
(standard-library dataclasses). Here the file is read back into the same dataclass, validated by
pydantic (a field of the wrong type refuses the record); nothing is declared again.

The repro's facts are kept apart from the record's own fields: a fact can never overwrite the status
or decide an outcome, except the few the orchestrator reads by name (``train``, ``guards``,
``scenario_facts``, ``crosscheck``), each validated here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from harness.core.json import JsonValue
from harness.records.item import AppliedGuard
from repros.runtime import record as written
from repros.runtime.record import ImportedPackage, Measured, RanAs, RankError

#: A rank's record is a few kilobytes; a file far larger is not one (and is not read whole).
MAX_RANK_RECORD_BYTES = 64 * 2**20

__all__ = [
    "ImportedPackage",
    "Measured",
    "RanAs",
    "RankError",
    "RankRecord",
    "TrainFacts",
    "parse_rank_record",
    "read_rank_record",
]


class TrainFacts(BaseModel):
    """What the fixed trainer records of a training (judged by ``harness/execution/classify.py``);
    non-finite numbers travel as their names ("nan", "inf")."""

    model_config = ConfigDict(frozen=True, extra="allow")

    losses: list[float | str | None] = Field(default_factory=list)
    adapter_grad_norms: dict[str, list[float | str | None]] = Field(default_factory=dict)
    adapter_weight_delta: dict[str, float | str | None] = Field(default_factory=dict)


@dataclass(frozen=True, kw_only=True, slots=True)
class RankRecord(written.RankRecord):
    """A rank's record as the rank declared it (``repros/runtime/record.py``), with the facts the
    orchestrator reads by name."""

    @property
    def train(self) -> TrainFacts | None:
        raw = self.facts.get("train")
        if not isinstance(raw, dict):
            return None
        try:
            return TrainFacts.model_validate(raw)
        except ValidationError:
            return None

    @property
    def guards(self) -> list[AppliedGuard] | None:
        raw = self.facts.get("guards")
        if not isinstance(raw, list):
            return None
        try:
            return [AppliedGuard.model_validate({"id": g} if isinstance(g, str) else g) for g in raw]
        except ValidationError:
            return None

    @property
    def scenario_facts(self) -> dict[str, JsonValue] | None:
        raw = self.facts.get("scenario_facts")
        return raw if isinstance(raw, dict) else None

    @property
    def crosscheck(self) -> dict[str, JsonValue] | None:
        """What a crosscheck item's rank recorded of its comparison (``repros/trainer/crosscheck/check.py``)."""
        raw = self.facts.get("crosscheck")
        return raw if isinstance(raw, dict) else None


_RANK_RECORD = TypeAdapter(RankRecord)


def parse_rank_record(raw: Mapping[str, object]) -> RankRecord:
    """A rank's record from what it wrote, validated (``ValidationError`` naming the field where it is
    not one). A repro that replaced ``ctx.facts`` with something other than a mapping still ran: its
    rank's record is read (status, error), and what it recorded is kept, under ``facts``; a rank that
    wrote something else than who it ran as still ran: its record is read, that part is not."""
    given = dict(raw)
    if "facts" in given and not isinstance(given["facts"], dict):
        given["facts"] = {"facts": given["facts"]}
    if "ran_as" in given and not isinstance(given["ran_as"], dict):
        given["ran_as"] = None
    return _RANK_RECORD.validate_python(given)


def read_rank_record(path: Path) -> RankRecord | None:
    """A rank's record, or None where it wrote none (or something that is not one)."""
    try:
        if path.stat().st_size > MAX_RANK_RECORD_BYTES:
            return None
        raw = json.loads(path.read_text(encoding="utf-8"))
        return parse_rank_record(raw) if isinstance(raw, dict) else None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, ValidationError):
        return None
