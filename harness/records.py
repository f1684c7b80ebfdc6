"""The records a run writes, typed: one ``ItemRecord`` per cell x repro x mode.

Records are JSON objects on disk (``results.jsonl``) and ``TypedDict``s in memory, so the
file format is exactly the dictionaries here, and every reader (compare, reports, history,
shards, bisect) is checked against one list of fields. ``parse_record`` is the one way a
line read back becomes a record: it refuses what is not a record of a known schema.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Required, TypedDict

from harness.environments import Environment
from harness.launchers.result import LaunchResult
from harness.metrics import empty_fields, summarise
from harness.outcome import Observation
from repros.common.context import TRACKED_PACKAGES
from repros.common.outcomes import UNOBSERVED, Outcome
from repros.common.spec import Expectation

#: The record layout this harness writes; a record of another version is refused, not guessed at.
SCHEMA_VERSION = 1
KNOWN_SCHEMA_VERSIONS = (1,)
#: The fields without which a line is not a record at all.
IDENTITY_FIELDS = ("schema_version", "cell", "repro", "mode", "outcome")
#: The longest error message a record keeps in the results file; the full text stays in the
#: rank's own record and log, and ``error.full_message_chars`` says how long it was.
MAX_MESSAGE_CHARS = 2000
#: The longest traceback a record keeps: its end (the raising frames and the exception), where
#: the cause of a failure nobody has named yet is read.
MAX_TRACEBACK_CHARS = 6000


@dataclass(frozen=True)
class ItemId:
    cell: str
    repro: str
    mode: str

    def label(self) -> str:
        return f"{self.cell}/{self.repro}/{self.mode}"


class StepTime(TypedDict):
    median: float
    min: float
    max: float
    iqr: float
    n: int


class ErrorSummary(TypedDict, total=False):
    type: Required[str]
    #: The first line of the message, at most ``MAX_MESSAGE_CHARS`` characters.
    message: Required[str]
    rank: Required[int | None]
    full_message_chars: int
    #: The failing rank's traceback (its last ``MAX_TRACEBACK_CHARS`` characters).
    traceback: str


class RankSummary(TypedDict, total=False):
    rank: int
    status: str
    phase: str | None
    exitcode: int | None
    error_type: str | None
    log_tail: str


class EnvSummary(TypedDict, total=False):
    key: str
    path: str | None
    python: str
    reused: bool
    build_s: float
    passthrough: bool
    extensions_dir: str


class ItemRecord(TypedDict, total=False):
    """One item's observation. ``Required`` fields are in every record; the rest are present
    where the item ran (launch, measures, ranks), or where a command adds them (bisect)."""

    schema_version: Required[int]
    run_id: Required[str]
    cell: Required[str]
    repro: Required[str]
    mode: Required[str]
    outcome: Required[str]
    signature: Required[str | None]
    expected: Required[str | None]
    expected_when: dict[str, str] | None
    expected_established_by: str | None
    expected_device: str | None
    matched: Required[bool]
    #: Explored (``run --explore``, or a repro with no expectation for the mode): the observation
    #: is a finding, reported per cell, never a missed expectation (unless nothing was observed).
    explored: bool
    #: The matrix cell a pinned or bisected cell was derived from (``--pin``, ``bisect``).
    cell_origin: str
    versions: Required[dict[str, str | None]]
    world_size: Required[int]
    device: Required[str | None]
    device_name: str | None
    cuda_version: str | None
    nccl_version: str | None
    backend: str | None
    # measures (repros/common/measures, merged by harness/metrics.py)
    peak_mem_bytes: int | None
    peak_mem_kind: str | None
    peak_mem_bytes_per_rank: dict[str, int]
    step_time_s: StepTime | None
    #: The training's own peak above its baseline (``repros/common/measures/train_peak_memory.py``).
    train_peak_mem_bytes: int | None
    train_peak_mem_kind: str | None
    train_peak_mem_bytes_per_rank: dict[str, int]
    #: CUDA: the allocator's reserved memory at its training peak above its baseline.
    train_peak_mem_reserved_bytes: int | None
    train_peak_mem_reserved_bytes_per_rank: dict[str, int]
    step_cpu_time_s: StepTime | None
    step_cuda_time_s: StepTime | None
    #: The test model's size the item ran at (``tiny`` or ``small``).
    model: str
    #: ``costs``: the workaround variant this item ran (its record's ``mode`` is the same name).
    variant: str
    #: ``grid``: the combination this item ran, axis -> value.
    scenario: dict[str, str]
    wall_s: Required[float]
    #: ``--reruns``: the earlier attempts of this item (outcome, signature, error, their directory),
    #: and whether a rerun matched the expectation the first attempt contradicted.
    attempts: list[dict[str, Any]]
    flaky: bool
    error: Required[ErrorSummary | None]
    reasons: Required[list[str]]
    guards: Required[list[dict[str, str]]]
    losses: list[float | str | None] | None
    ranks: list[RankSummary]
    launcher_tail: str
    leftovers_killed: list[int]
    stale_build_locks_removed: list[str]
    shm_segments_removed: list[str]
    env: Required[EnvSummary | None]
    repro_cmd: Required[str]
    launch_cmd: list[str]
    launcher: str
    launcher_fallback: str
    gpus_leased: list[str]
    #: Why the cell's environment was rebuilt before this item (it was found damaged), if it was.
    environment_repaired: str
    item_dir: str
    started_at: Required[str]
    finished_at: Required[str]
    # bisect
    bisect_point: str
    bisect_step_s: float
    same_as_earlier: bool


class RecordError(ValueError):
    """A line that is not a record this harness can read."""


def parse_record(value: object) -> ItemRecord:
    """``value`` (one decoded JSON line) as a record, or ``RecordError`` saying why not."""
    if not isinstance(value, dict):
        raise RecordError(f"is a JSON {type(value).__name__}, not a record object")
    missing = [f for f in IDENTITY_FIELDS if f not in value]
    if missing:
        raise RecordError(f"has no {', '.join(missing)}")
    version = value["schema_version"]
    if version not in KNOWN_SCHEMA_VERSIONS:
        raise RecordError(
            f"has schema_version {version!r}; this harness reads {', '.join(map(str, KNOWN_SCHEMA_VERSIONS))} "
            "(written by another version of ft-regress)"
        )
    for name in ("cell", "repro", "mode", "outcome"):
        if not isinstance(value[name], str):
            raise RecordError(f"field {name} is {type(value[name]).__name__}, not text")
    return value  # type: ignore[return-value]


def tracked_versions(env: Environment | None) -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": env.python_version if env else None}
    for name in TRACKED_PACKAGES:
        versions[name] = env.version(name) if env else None
    return versions


def error_summary(error_type: str, message: str, rank: int | None, traceback: str | None = None) -> ErrorSummary:
    """The first non-blank line of ``message``, capped; the full length recorded where it was cut;
    and the end of the rank's traceback where there is one."""
    first = next((ln for ln in message.splitlines() if ln.strip()), "")
    summary: ErrorSummary = {"type": error_type, "message": first[:MAX_MESSAGE_CHARS], "rank": rank}
    if len(first) > MAX_MESSAGE_CHARS:
        summary["full_message_chars"] = len(message)
    if traceback:
        summary["traceback"] = traceback[-MAX_TRACEBACK_CHARS:]
    return summary


def _expectation_fields(expected: Expectation | None, outcome: str) -> dict[str, Any]:
    return {
        "expected": str(expected.outcome) if expected else None,
        "expected_when": dict(expected.when) if expected else None,
        "expected_established_by": expected.established_by if expected else None,
        "expected_device": expected.device if expected else None,
        # An observation with no expectation for its versions is not a match:
        # somebody has to look at it and record what it should be.
        "matched": bool(expected and expected.outcome == outcome),
    }


def env_summary(env: Environment | None) -> EnvSummary | None:
    if env is None:
        return None
    return {
        "key": env.key,
        "path": env.path,
        "python": env.python,
        "reused": env.reused,
        "build_s": round(env.build_s, 3),
        "passthrough": env.passthrough,
        "extensions_dir": env.extensions_dir,
    }


def item_device(launch: LaunchResult) -> str | None:
    """The device type the ranks ran on, as the first rank that set one up recorded it."""
    first = next((rec for rec in launch.records.values() if rec and rec.get("device")), None)
    return str(first["device"]) if first else None


def item_record(
    *,
    run_id: str,
    item: ItemId,
    observation: Observation,
    expected: Expectation | None,
    env: Environment,
    launch: LaunchResult,
    repro_cmd: str,
    item_dir: Path,
    started_at: str,
    finished_at: str,
) -> ItemRecord:
    records = [rec for rec in launch.records.values() if rec is not None]
    first: Mapping[str, Any] = next((rec for rec in records if rec.get("device")), {})
    train = next((rec.get("train") for rec in records if rec.get("rank") == 0 and rec.get("train")), None)
    record: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "cell": item.cell,
        "repro": item.repro,
        "mode": item.mode,
        "outcome": str(observation.outcome),
        "signature": observation.signature,
        **_expectation_fields(expected, observation.outcome),
        "versions": tracked_versions(env),
        "world_size": launch.world_size,
        "device": first.get("device"),
        "device_name": first.get("device_name"),
        "cuda_version": first.get("cuda_version"),
        "nccl_version": first.get("nccl_version"),
        "backend": first.get("backend"),
        **summarise(records),
        "wall_s": round(launch.wall_s, 3),
        "error": (
            error_summary(observation.error.type, observation.error.message, observation.error.rank,
                          observation.error.traceback)
            if observation.error
            else None
        ),
        "reasons": list(observation.reasons),
        "guards": next((rec.get("guards") for rec in records if rec.get("guards") is not None), []),
        "losses": train.get("losses") if train else None,
        "ranks": [
            {
                "rank": rank,
                "status": rec.get("status") if rec else "missing",
                "phase": rec.get("phase") if rec else None,
                "exitcode": launch.rank_exitcodes.get(rank),
                "error_type": (rec.get("error") or {}).get("type") if rec else None,
                "log_tail": launch.rank_tails.get(rank, ""),
            }
            for rank, rec in sorted(launch.records.items())
        ],
        "launcher_tail": launch.launcher_tail,
        "leftovers_killed": launch.leftovers_killed,
        "stale_build_locks_removed": launch.stale_build_locks_removed,
        "shm_segments_removed": launch.shm_segments_removed,
        "env": env_summary(env),
        "repro_cmd": repro_cmd,
        "launch_cmd": launch.command,
        "launcher": launch.launcher,
        "item_dir": str(item_dir),
        "started_at": started_at,
        "finished_at": finished_at,
    }
    return record  # type: ignore[return-value]


def unobserved_record(
    *,
    outcome: Outcome,
    error_type: str,
    run_id: str,
    item: ItemId,
    reason: str,
    world_size: int,
    repro_cmd: str,
    started_at: str,
    finished_at: str,
) -> ItemRecord:
    """An item that could not run at all (no environment, a repro that does not load)."""
    record: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "cell": item.cell,
        "repro": item.repro,
        "mode": item.mode,
        "outcome": str(outcome),
        "signature": None,
        # Nothing ran, so there are no versions to look an expectation up by.
        **_expectation_fields(None, outcome),
        "versions": tracked_versions(None),
        "world_size": world_size,
        "device": None,
        "backend": None,
        **empty_fields(),
        "wall_s": 0.0,
        "error": error_summary(error_type, reason, None),
        "reasons": [reason],
        "guards": [],
        "env": None,
        "repro_cmd": repro_cmd,
        "started_at": started_at,
        "finished_at": finished_at,
    }
    return record  # type: ignore[return-value]


def is_finding(record: Mapping[str, Any]) -> bool:
    """An explored item that observed something: what it found is the result, matched or not."""
    return bool(record.get("explored")) and record.get("outcome") not in UNOBSERVED


def counts_against(record: Mapping[str, Any]) -> bool:
    """Whether the record makes a run fail (exit 1, a JUnit failure, a failed pytest item): it
    did not match its expectation and is not an explored item's finding."""
    return not record.get("matched") and not is_finding(record)


def key(record: Mapping[str, Any]) -> tuple[str, str, str]:
    """An item's identity in a run: (cell, repro, mode)."""
    return str(record["cell"]), str(record["repro"]), str(record["mode"])


def labels(records: Sequence[Mapping[str, Any]]) -> list[str]:
    return [ItemId(*key(r)).label() for r in records]
