"""Result records: one JSON object per cell x repro x mode in ``results.jsonl``.

Each record is appended as its item finishes, as one line written with a single
``write`` and flushed to disk, so a run that is interrupted keeps every record it
finished, whole.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.environments import Environment
from harness.launch import LaunchResult
from harness.metrics import peak_memory, step_time_summary
from harness.outcome import Observation
from repros.common.context import TRACKED_PACKAGES
from repros.common.spec import Expectation

SCHEMA_VERSION = 1
RESULTS_FILE = "results.jsonl"


@dataclass(frozen=True)
class ItemId:
    cell: str
    repro: str
    mode: str

    def label(self) -> str:
        return f"{self.cell}/{self.repro}/{self.mode}"


def tracked_versions(env: Environment | None) -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": env.python_version if env else None}
    for name in TRACKED_PACKAGES:
        versions[name] = env.version(name) if env else None
    return versions


def _expectation_fields(expected: Expectation | None, outcome: str) -> dict[str, Any]:
    return {
        "expected": expected.outcome if expected else None,
        "expected_when": dict(expected.when) if expected else None,
        "expected_established_by": expected.established_by if expected else None,
        # An observation with no expectation for its versions is not a match:
        # somebody has to look at it and record what it should be.
        "matched": bool(expected and expected.outcome == outcome),
    }


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
) -> dict[str, Any]:
    records = [rec for rec in launch.records.values() if rec is not None]
    peak, peak_kind, peak_per_rank = peak_memory(records)
    first = next((rec for rec in records if rec.get("device")), {})
    train = next((rec.get("train") for rec in records if rec.get("rank") == 0 and rec.get("train")), None)
    return {
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "cell": item.cell,
        "repro": item.repro,
        "mode": item.mode,
        "outcome": observation.outcome,
        "signature": observation.signature,
        **_expectation_fields(expected, observation.outcome),
        "versions": tracked_versions(env),
        "world_size": launch.world_size,
        "device": first.get("device"),
        "device_name": first.get("device_name"),
        "cuda_version": first.get("cuda_version"),
        "nccl_version": first.get("nccl_version"),
        "backend": first.get("backend"),
        "peak_mem_bytes": peak,
        "peak_mem_kind": peak_kind,
        "peak_mem_bytes_per_rank": {str(k): v for k, v in sorted(peak_per_rank.items())},
        "step_time_s": step_time_summary(records),
        "wall_s": round(launch.wall_s, 3),
        "error": observation.error.as_record() if observation.error else None,
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


def env_summary(env: Environment | None) -> dict[str, Any] | None:
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


def unobserved_record(
    *,
    outcome: str,
    error_type: str,
    run_id: str,
    item: ItemId,
    reason: str,
    world_size: int,
    repro_cmd: str,
    started_at: str,
    finished_at: str,
) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "cell": item.cell,
        "repro": item.repro,
        "mode": item.mode,
        "outcome": outcome,
        "signature": None,
        # Nothing ran, so there are no versions to look an expectation up by.
        **_expectation_fields(None, outcome),
        "versions": tracked_versions(None),
        "world_size": world_size,
        "device": None,
        "backend": None,
        "peak_mem_bytes": None,
        "peak_mem_kind": None,
        "step_time_s": None,
        "wall_s": 0.0,
        "error": {"type": error_type, "message": reason.splitlines()[0] if reason else "", "rank": None},
        "reasons": [reason],
        "guards": [],
        "env": None,
        "repro_cmd": repro_cmd,
        "started_at": started_at,
        "finished_at": finished_at,
    }


class ResultsWriter:
    """Appends records to ``results.jsonl``, one whole line at a time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def append(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record, sort_keys=True, default=str) + "\n").encode("utf-8")
        os.write(self._fd, line)
        os.fsync(self._fd)

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> ResultsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_results(path: Path) -> list[dict[str, Any]]:
    """Every whole record in a results file (a torn last line is ignored)."""
    records = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records
