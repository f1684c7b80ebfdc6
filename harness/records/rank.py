"""What one rank recorded (``items/<cell>/<item>/rank<N>.json``), as the orchestrator reads it.

A rank (``repros/runtime/rank_main.py``, standard library only) writes its record when it starts
(``status: running``) and again when it ends (``ok``, ``error`` or ``unavailable``): its identity,
the device it set up, the error it raised, its meters' results under ``measures`` and whatever the
repro recorded under ``facts``. The facts are the repro's, kept apart from the record's own fields:
a fact can never overwrite the status or decide an outcome, except the few the orchestrator reads
by name (``train``, ``guards``, ``scenario_facts``), each validated here.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from harness.core.json import JsonValue
from harness.records.item import AppliedGuard

#: A rank's record is a few kilobytes; a file far larger is not one (and is not read whole).
MAX_RANK_RECORD_BYTES = 64 * 2**20


class _Read(BaseModel):
    """A part of a rank record: typed where the orchestrator reads it, the rest kept as written."""

    model_config = ConfigDict(frozen=True, extra="allow")


class RankError(_Read):
    #: The exception's qualified type (``torch.utils.checkpoint.CheckpointError``).
    type: str
    #: What it is a kind of: each base class, qualified as ``type`` is (``ValueError``...).
    bases: list[str] = Field(default_factory=list)
    message: str = ""
    traceback: str | None = None
    #: Each signature's own checks, judged in the rank where their code is (a user's repro).
    signature_verdicts: dict[str, bool] = Field(default_factory=dict)
    #: Where the error is the cell's stack failing (a package that does not import, one the cell
    #: lacks; ``repros/runtime/stack_failure.py``): why. INFRA unless a documented signature names it.
    stack_failure: str | None = None


class Measured(_Read):
    """One meter's result (``repros/runtime/measures``)."""

    kind: str | None = None
    value: float | None = None
    per_step: list[float] | None = None


class ImportedPackage(_Read):
    """What a rank imported of a tracked package, or would have (``repros/runtime/context.py``)."""

    version: str | None = None
    path: str | None = None
    imported: bool = False


class TrainFacts(_Read):
    """What the fixed trainer records of a training (judged by ``harness/execution/classify.py``);
    non-finite numbers travel as their names ("nan", "inf")."""

    losses: list[float | str | None] = Field(default_factory=list)
    adapter_grad_norms: dict[str, list[float | str | None]] = Field(default_factory=dict)
    adapter_weight_delta: dict[str, float | str | None] = Field(default_factory=dict)


class RanAs(_Read):
    """Who a rank's code was told it is, as it ended (``repros/runtime/record.py``: ``ran_as``)."""

    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    #: ``environment`` (torchrun's variables as the rank left them) or ``process group``.
    source: str | None = None


class RankRecord(_Read):
    record_version: int = 1
    rank: int
    local_rank: int | None = None
    world_size: int | None = None
    pid: int | None = None
    mode: str | None = None
    status: str
    phase: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    versions: dict[str, str | None] = Field(default_factory=dict)
    #: What the rank imported of each tracked package (its version, where it lay), written at its end.
    versions_imported: dict[str, ImportedPackage] = Field(default_factory=dict)
    python_version: str | None = None
    #: When its first training step began (``time.time()``), where it trained.
    training_began_at: float | None = None
    #: When its last training step ended.
    training_ended_at: float | None = None
    #: The rendezvous: DeepSpeed names its /dev/shm segments after it.
    master_addr: str | None = None
    master_port: str | None = None
    device: str | None = None
    backend: str | None = None
    device_name: str | None = None
    cuda_version: str | None = None
    nccl_version: str | None = None
    model: str | None = None
    unavailable_reason: str | None = None
    error: RankError | None = None
    measures: dict[str, Measured] = Field(default_factory=dict)
    warmup_steps: int = 0
    wall_s: float | None = None
    #: The CPU seconds the rank (and the children it waited for) used.
    cpu_s: float | None = None
    #: What the repro recorded (``ctx.facts``).
    facts: dict[str, JsonValue] = Field(default_factory=dict)
    #: Who its code was told it is as it ended, where the rank said (a repro's own settings may
    #: have told it another rank or world than it was launched as).
    ran_as: RanAs | None = None
    #: What became of DeepSpeed's CPU shared-memory comm op where its comm backend started (left
    #: unbuilt: no training uses it; ``repros/runtime/deepspeed_comm.py``); None where it never did.
    deepspeed_shm_comm: str | None = None

    @field_validator("ran_as", mode="before")
    @classmethod
    def _ran_as_if_readable(cls, value: JsonValue) -> JsonValue:
        """A rank that wrote something else there still ran: its record is read, that part is not."""
        return value if isinstance(value, dict) else None

    @field_validator("facts", mode="before")
    @classmethod
    def _facts_as_recorded(cls, value: JsonValue) -> JsonValue:
        """A repro that replaced ``ctx.facts`` with something other than a mapping still ran: its
        rank's record is read (status, error), and what it recorded is kept, under ``facts``."""
        return value if isinstance(value, dict) else {"facts": value}

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


def read_rank_record(path: Path) -> RankRecord | None:
    """A rank's record, or None where it wrote none (or something that is not one)."""
    try:
        if path.stat().st_size > MAX_RANK_RECORD_BYTES:
            return None
        return RankRecord.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, ValidationError):
        return None
