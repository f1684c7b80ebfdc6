"""Realistic run directories for the report tests: results.jsonl and run.json as a
run writes them, with every kind of outcome, two cells, an excluded item and a
message that tries to inject markup."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.records.item import ItemRecord, parse_record

HOSTILE = '<script>alert(1)</script> "quoted" & <b>bold</b>'
MIB = 2**20

VERSIONS_NEW = {
    "python": "3.11.7",
    "torch": "2.13.0+cpu",
    "deepspeed": "0.19.8",
    "peft": "0.21.2",
    "transformers": "5.23.0",
    "accelerate": "1.15.0",
    "bitsandbytes": "0.50.2",
}
VERSIONS_OLD = {**VERSIONS_NEW, "deepspeed": "0.19.2"}


def _step(median: float, iqr: float = 0.004) -> dict[str, Any]:
    return {"median": median, "min": median - 0.01, "max": median + 0.02, "iqr": iqr, "n": 6}


def _record(cell: str, repro: str, mode: str, outcome: str, **fields: Any) -> dict[str, Any]:
    versions = VERSIONS_OLD if cell == "ds-0.19.2" else VERSIONS_NEW
    record: dict[str, Any] = {
        "schema_version": 1,
        "run_id": "RUN",
        "cell": cell,
        "repro": repro,
        "mode": mode,
        "outcome": outcome,
        "signature": None,
        "expected": outcome,
        "expected_when": {"deepspeed": ">=0.19.3"},
        "expected_established_by": "python -m harness run --cells current",
        "matched": True,
        "versions": versions,
        "world_size": 2,
        "device": "cpu",
        "backend": "gloo",
        "peak_mem_bytes": 900 * MIB,
        "peak_mem_kind": "cpu_peak_rss",
        "peak_mem_bytes_per_rank": {"0": 900 * MIB, "1": 880 * MIB},
        "step_time_s": _step(0.210),
        "wall_s": 31.5,
        "error": None,
        "reasons": [],
        "guards": [],
        "ranks": [
            {"rank": r, "status": "ok", "phase": "done", "exitcode": 0, "error_type": None, "log_tail": "loss 2.1"}
            for r in (0, 1)
        ],
        "launcher_tail": "",
        "env": {
            "key": f"key-{cell}",
            "path": f"/cache/envs/key-{cell}",
            "python": "/cache/python",
            "reused": True,
            "build_s": 0.0,
        },
        "repro_cmd": f"python -m harness run --matrix matrix.yaml --cells {cell} --repros {repro} --modes {mode}",
        "item_dir": f"/tmp/run/items/{cell}/{repro}-{mode}",
        "started_at": "2026-11-20T10:00:00+00:00",
        "finished_at": "2026-11-20T10:00:31+00:00",
    }
    record.update(fields)
    return record


GUARDS = [
    {"id": "ds-zero3-ckpt-reentrant", "reason": "deepspeed<0.19.3 recomputes ZeRO-3 params as shape [0]"},
    {"id": "fp32-upcast-off", "reason": "keep bf16 recompute"},
]


def typed(raw: list[dict[str, Any]]) -> list[ItemRecord]:
    """The records as the harness reads them back from ``results.jsonl``."""
    return [parse_record(r) for r in raw]


def records(run_id: str = "run-b", slower: float = 0.0) -> list[dict[str, Any]]:
    """One run over cells ``current`` and ``ds-0.19.2`` with every outcome the page shows."""
    rows = [
        # current: the bug is fixed upstream; the fixed trainer needs no guard there.
        _record("current", "F1", "bug", "NOT_REPRODUCED", step_time_s=_step(0.200 + slower)),
        _record("current", "F1", "fixed", "PASS", step_time_s=_step(0.205 + slower), peak_mem_bytes=905 * MIB),
        # ds-0.19.2: the documented failure, and the fixed trainer's guards.
        _record(
            "ds-0.19.2",
            "F1",
            "bug",
            "REPRODUCED",
            signature="F1.recompute-shape-0",
            error={"type": "CheckpointError", "message": "Recomputed values have shape [0]", "rank": 0},
            step_time_s=None,
        ),
        _record("ds-0.19.2", "F1", "fixed", "PASS", guards=GUARDS, peak_mem_bytes=1200 * MIB),
        # F2 in current: bug mode ran clean, the fixed trainer applied a guard but failed.
        _record("current", "F2", "bug", "NOT_REPRODUCED", step_time_s=_step(0.300), peak_mem_bytes=1000 * MIB),
        _record(
            "current",
            "F2",
            "fixed",
            "FAIL",
            expected="PASS",
            matched=False,
            guards=GUARDS[:1],
            reasons=["rank 1: loss did not fall (2.31 -> 2.35)", "lora_B.weight got no gradient"],
            step_time_s=_step(0.360),
            peak_mem_bytes=1300 * MIB,
        ),
        # F2 in ds-0.19.2: a different error whose message tries to inject markup.
        _record(
            "ds-0.19.2",
            "F2",
            "bug",
            "DIFFERENT_ERROR",
            expected="REPRODUCED",
            matched=False,
            error={"type": "RuntimeError", "message": HOSTILE, "rank": 1},
            ranks=[
                {"rank": 0, "status": "ok", "phase": "step", "exitcode": 0, "error_type": None, "log_tail": "fine"},
                {
                    "rank": 1,
                    "status": "error",
                    "phase": "step",
                    "exitcode": 1,
                    "error_type": "RuntimeError",
                    "log_tail": f"Traceback (most recent call last):\nRuntimeError: {HOSTILE}",
                },
            ],
            step_time_s=None,
        ),
    ]
    unresolvable = {
        "schema_version": 1,
        "run_id": run_id,
        "cell": "tf4",
        "repro": "F1",
        "mode": "bug",
        "outcome": "UNRESOLVABLE",
        "signature": None,
        "expected": None,
        "expected_when": None,
        "expected_established_by": None,
        "matched": False,
        "versions": {k: None for k in VERSIONS_NEW},
        "world_size": 2,
        "device": None,
        "backend": None,
        "peak_mem_bytes": None,
        "peak_mem_kind": None,
        "step_time_s": None,
        "wall_s": 0.0,
        "error": {"type": "EnvironmentUnavailable", "message": "No solution found: transformers==4.57.6", "rank": None},
        "reasons": ["No solution found: transformers==4.57.6 has no wheels for this platform"],
        "guards": [],
        "env": None,
        "repro_cmd": "python -m harness run --matrix matrix.yaml --cells tf4 --repros F1 --modes bug",
        "started_at": "2026-11-20T10:00:00+00:00",
        "finished_at": "2026-11-20T10:00:01+00:00",
    }
    for row in rows:
        row["run_id"] = run_id
    return [*rows, unresolvable]


EXCLUDED = [{"cell": "tf4", "repro": "F1", "mode": "fixed", "reason": "needs transformers 5 (<i>see</i> #12)"}]


def write_run(directory: Path, run_id: str, started_at: str, recs: list[dict[str, Any]]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "results.jsonl", "w", encoding="utf-8") as fh:
        for rec in recs:
            fh.write(json.dumps(rec, sort_keys=True) + "\n")
    meta = {
        "run_id": run_id,
        "started_at": started_at,
        "finished_at": started_at,
        "argv": ["run", "--lane", "ci"],
        "lane": "ci",
        "git_commit": "0123456789abcdef",
        "matrix": {"path": "matrix.yaml", "sha256": "ab" * 32},
        "host": {"cpu_model": "Test CPU", "cpus": 2, "gpus": [], "platform": "Linux", "machine": "x86_64"},
        "planned": [f"{r['cell']}/{r['repro']}/{r['mode']}" for r in recs],
        "excluded": EXCLUDED,
        "cells": {
            "current": {"key": "key-current", "reused": True},
            "ds-0.19.2": {"key": "key-ds", "reused": False, "build_s": 42.0},
            "tf4": {"unavailable": "No solution found: transformers==4.57.6"},
        },
    }
    (directory / "run.json").write_text(json.dumps(meta, indent=1))
    return directory


def write_reports(reports: Path) -> Path:
    """Two runs side by side in ``reports``; returns the newer one's directory."""
    older = records("run-a")
    for rec in older:
        if rec["cell"] == "current" and rec["repro"] == "F2" and rec["mode"] == "fixed":
            rec.update(outcome="PASS", matched=True, reasons=[])
    write_run(reports / "run-a", "run-a", "2026-11-19T10:00:00+00:00", older)
    return write_run(reports / "run-b", "run-b", "2026-11-20T10:00:00+00:00", records("run-b", slower=0.02))
