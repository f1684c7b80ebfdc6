"""The per-rank record a worker writes, as both sides of the process boundary know it. Standard
library only.

``RankRecord`` (and its parts) is the one declaration of what a rank records: ``rank_main`` fills
one and writes it (``write_rank_record``), and the orchestrator reads the file back into the same
dataclass, validated by pydantic (``harness/records/rank.py``). A key nobody declared cannot be
written (the dataclasses are frozen and slotted: a misspelt field is an error where it is set).

A rank writes its record when it starts (``status: running``) and rewrites it when
it ends (``ok``, ``error`` or ``unavailable``). A record still ``running`` after the
launch ended means the rank died without reaching its own exception handler.
The write is atomic (temporary file, then rename), so the orchestrator never reads
half a record.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

RECORD_VERSION = 1

_Record = TypeVar("_Record", bound="RankRecord")

#: What a rank's ``status`` says: still running (or died before it could say more), ended, raised,
#: or found its scenario cannot run in this cell.
RUNNING, OK, ERROR, UNAVAILABLE = "running", "ok", "error", "unavailable"


@dataclass(frozen=True, kw_only=True, slots=True)
class RankError:
    """What a rank raised."""

    #: The exception's qualified type (``torch.utils.checkpoint.CheckpointError``).
    type: str
    #: What it is a kind of: each base class, qualified as ``type`` is (``ValueError``...).
    bases: list[str] = field(default_factory=list)
    message: str = ""
    traceback: str | None = None
    #: Each signature's own checks, judged in the rank where their code is (a user's repro).
    signature_verdicts: dict[str, bool] = field(default_factory=dict)
    #: Where the error is the cell's stack failing (a package that does not import, one the cell
    #: lacks; ``repros/runtime/stack_failure.py``): why. INFRA unless a documented signature names it.
    stack_failure: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Measured:
    """One meter's result (``repros/runtime/measures``)."""

    kind: str | None = None
    value: float | None = None
    per_step: list[float] | None = None

    @classmethod
    def of(cls, result: Mapping[str, Any]) -> Measured:
        """A meter's result as it returned it (the keys a result has; any other is not kept)."""
        return cls(kind=result.get("kind"), value=result.get("value"), per_step=result.get("per_step"))


@dataclass(frozen=True, kw_only=True, slots=True)
class ImportedPackage:
    """What a rank imported of a tracked package, or would have (``repros/runtime/context.py``)."""

    version: str | None = None
    path: str | None = None
    imported: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class RanAs:
    """Who a rank's code was told it is, as it ended (``ran_as``)."""

    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    #: ``environment`` (torchrun's variables as the rank left them) or ``process group``.
    source: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class RankRecord:
    """What one rank records (``items/<cell>/<item>/rank<N>.json``)."""

    record_version: int = RECORD_VERSION
    rank: int
    local_rank: int | None = None
    world_size: int | None = None
    pid: int | None = None
    mode: str | None = None
    #: ``RUNNING``, ``OK``, ``ERROR`` or ``UNAVAILABLE``.
    status: str
    #: ``import``, ``setup``, ``run``, ``teardown``: the phase it is in, written as it enters it.
    phase: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    #: What the cell's metadata says of each tracked package.
    versions: dict[str, str | None] = field(default_factory=dict)
    #: What the rank imported of each tracked package (its version, where it lay), written at its end.
    versions_imported: dict[str, ImportedPackage] = field(default_factory=dict)
    python_version: str | None = None
    #: When its first training step began (``time.time()``), where it trained.
    training_began_at: float | None = None
    #: When its last training step ended.
    training_ended_at: float | None = None
    #: The rendezvous: DeepSpeed names its /dev/shm segments after it, and the orchestrator removes
    #: them after the item by these names.
    master_addr: str | None = None
    master_port: str | None = None
    device: str | None = None
    backend: str | None = None
    device_name: str | None = None
    cuda_version: str | None = None
    nccl_version: str | None = None
    #: The test model's size and family it trained.
    model: str | None = None
    family: str | None = None
    unavailable_reason: str | None = None
    error: RankError | None = None
    measures: dict[str, Measured] = field(default_factory=dict)
    warmup_steps: int = 0
    wall_s: float | None = None
    #: The CPU seconds the rank (and the children it waited for) used.
    cpu_s: float | None = None
    #: What became of DeepSpeed's CPU shared-memory comm op where its comm backend started (left
    #: unbuilt: no training uses it; ``repros/runtime/deepspeed_comm.py``); None where it never did.
    deepspeed_shm_comm: str | None = None
    #: What the repro recorded (``ctx.facts``), apart from the record's own fields: a fact can never
    #: overwrite the status or decide an outcome.
    facts: dict[str, Any] = field(default_factory=dict)
    #: Who its code was told it is as it ended, where the rank said (a repro's own settings may
    #: have told it another rank or world than it was launched as).
    ran_as: RanAs | None = None

    def evolve(self: _Record, **changes: Any) -> _Record:
        """A new record: this one with ``changes`` (by field name; a name not declared is an error)."""
        return dataclasses.replace(self, **changes)


def as_json(value: Any) -> Any:
    """A record (or any part of it) as JSON values: dataclasses as objects, field by field. Nothing is
    copied deeply: what a repro recorded under ``facts`` is written as ``json`` can (``str`` the rest)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: as_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [as_json(v) for v in value]
    return value


def rank_record_path(item_dir: Path, rank: int) -> Path:
    return item_dir / f"rank{rank}.json"


def rank_log_path(item_dir: Path, rank: int) -> Path:
    return item_dir / f"rank{rank}.log"


def log_pipe_path(log_path: Path) -> Path:
    """Where the orchestrator listens for what is written to ``log_path`` (a named pipe it copies
    into ``log_path``, capped); absent when nobody listens (the log is then written directly)."""
    return log_path.with_name(f".{log_path.name}.pipe")


def log_of_pipe(path: Path) -> Path | None:
    """The log a pipe of ``log_pipe_path`` is copied into (what a rank's stdout, a pipe, stands
    for), or None where ``path`` is not such a pipe."""
    name = path.name
    if name.startswith(".") and name.endswith(".pipe") and len(name) > len("..pipe"):
        return path.with_name(name[1 : -len(".pipe")])
    return None


def open_log(log_path: Path) -> int:
    """A descriptor to write ``log_path`` through: the orchestrator's pipe for it where one is
    listening, else the file itself (appended)."""
    pipe = log_pipe_path(log_path)
    try:
        if stat.S_ISFIFO(os.stat(pipe).st_mode):
            # Non-blocking only to fail at once (ENXIO) where nobody reads; writes then block.
            fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
            os.set_blocking(fd, True)
            return fd
    except OSError:
        pass
    return os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def write_rank_record(item_dir: Path, rank: int, record: RankRecord | Mapping[str, Any]) -> None:
    """Write ``record`` as the rank's record, atomically (a stand-in rank of the tests may write a
    mapping of its own)."""
    path = rank_record_path(item_dir, rank)
    tmp = path.with_suffix(f".json.tmp{os.getpid()}")
    written = as_json(record) if isinstance(record, RankRecord) else {"record_version": RECORD_VERSION, **record}
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(written, fh, default=str)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _whole(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def ran_as() -> RanAs:
    """Who the rank was as it ended, as its own code saw it: its rank, local rank and world size in
    the variables torchrun sets (which a repro's settings, a script's ``env:``, may have changed),
    and from its process group where one is still set up (what collectives ran with). The
    orchestrator records this, not what it launched, where they differ."""
    import sys

    seen = RanAs(
        rank=_whole(os.environ.get("RANK")),
        local_rank=_whole(os.environ.get("LOCAL_RANK")),
        world_size=_whole(os.environ.get("WORLD_SIZE")),
        source="environment",
    )
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            seen = dataclasses.replace(
                seen, rank=int(dist.get_rank()), world_size=int(dist.get_world_size()), source="process group"
            )
    except Exception:  # noqa: BLE001 - a group being torn down: the variables say it
        pass
    return seen


class ScenarioUnavailable(Exception):
    """Raised by a repro when its scenario cannot run in this cell at all (a missing
    device, a library that lacks the feature). The outcome is ``INFRA``, never a
    reproduction or a different error."""
