"""Really runs crosscheck in the shipped matrix's current cell (real uv environment, real ranks): strategies
agree with one process, and every kind of deliberate fault put into a strategy is caught, where it was put."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.paths import REPO_ROOT, results_json

pytestmark = pytest.mark.integration

#: One engine that reduces every micro-batch (DDP, float32) and one that shards and accumulates by its own count
#: in bf16 (ZeRO-2): both paths of the comparison, both regimes of the reference.
STRATEGIES = "ddp-fp32-accum-manual,zero2-bf16-accum-engine"


def crosscheck(tmp: Path, *args: str) -> tuple[int, list[dict[str, Any]], str]:
    shipped = yaml.safe_load((REPO_ROOT / "matrix.yaml").read_text())
    matrix = {**shipped, "cells": {"current": shipped["cells"]["current"]}, "exclude": []}
    path = tmp / "matrix.yaml"
    path.write_text(yaml.safe_dump(matrix, sort_keys=False))
    out = tmp / "out"
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "crosscheck",
            "--matrix",
            str(path),
            "--cells",
            "current",
            *args,
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        timeout=1800,
    )
    return done.returncode, results_json(out / "results.jsonl"), done.stdout + done.stderr


def test_strategies_agree_with_one_process_and_say_how_close_they_came(tmp_path: Path) -> None:
    status, records, said = crosscheck(tmp_path, "--strategies", STRATEGIES)
    assert status == 0, said[-4000:]
    assert [r["strategy"] for r in records] == STRATEGIES.split(",")
    for record in records:
        assert record["kind"] == "crosscheck" and record["outcome"] == "AGREES" and record["matched"], record["reasons"]
        assert record["divergence"] is None
        assert record["strategy_parts"]["engine"] in ("ddp", "deepspeed")
        assert record["versions"]["torch"].startswith("2.13.0")
        compared = record["crosscheck"]
        assert 0 <= compared["closest_ratio"] < 1 and compared["compared"] > 100
        assert len(compared["trajectory"]["loss"]) == len(compared["reference_trajectory"]["loss"]) == 4
        assert compared["reference"]["processes"] == 1
        assert "crosscheck" in record["repro_cmd"] and record["strategy"] in record["repro_cmd"]
    assert records[1]["crosscheck"]["reference"]["regime"] == "bf16-weights"  # ZeRO's bf16, its master weights


@pytest.mark.parametrize(
    ("fault", "quantity", "step"),
    [
        ("grad-half", ("grad_norm",), 0),
        ("drop-micro-batch", ("grad_norm", "gradient", "loss"), 1),
        ("skip-step", ("optimizer_steps",), 1),
        ("unsaved-tensor", ("saved_adapter",), 3),
    ],
)
def test_a_strategy_broken_on_purpose_is_caught_where_it_was_broken(
    tmp_path: Path, fault: str, quantity: tuple[str, ...], step: int
) -> None:
    status, records, said = crosscheck(tmp_path, "--strategies", STRATEGIES, "--break", fault)
    assert status == 0, said[-4000:]  # every item diverged, as a deliberate fault must
    assert len(records) == 2
    for record in records:
        assert record["outcome"] == "DIVERGES" and record["expected"] == "DIVERGES" and record["matched"]
        divergence = record["divergence"]
        assert divergence["quantity"] in quantity and divergence["step"] == step, divergence
        assert float(divergence["rel_diff"]) > float(divergence["tolerance"])
        assert record["signature"] is None  # no documented failure explains a fault put in on purpose
