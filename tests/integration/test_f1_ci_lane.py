"""Really runs F1 in the ci lane's cells: real uv environments, real torchrun ranks.

Beside them stands a cell pinned to a release that does not exist: it must end
UNRESOLVABLE with the installer's reason while the other cells still run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.results import read_results
from harness.runner import REPO_ROOT

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, list[dict], Path, str]:
    shipped = yaml.safe_load((REPO_ROOT / "matrix.yaml").read_text())
    cells = {name: cell for name, cell in shipped["cells"].items() if "ci" in cell.get("lanes", [])}
    cells["no-such-peft"] = {"packages": {"peft": "==0.0.999"}, "lanes": ["ci"]}
    matrix = {**shipped, "cells": cells, "exclude": []}
    work = tmp_path_factory.mktemp("ci-run")
    matrix_path = work / "matrix.yaml"
    matrix_path.write_text(yaml.safe_dump(matrix, sort_keys=False))
    out = work / "out"
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV"}}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "run",
            "--matrix",
            str(matrix_path),
            "--lane",
            "ci",
            "--repros",
            "F1",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        timeout=3000,
    )
    return proc.returncode, read_results(out / "results.jsonl"), out, proc.stdout + proc.stderr


def outcomes(records: list[dict]) -> dict[tuple[str, str], str]:
    return {(r["versions"]["deepspeed"] or r["cell"], r["mode"]): r["outcome"] for r in records}


def test_f1_outcomes_in_both_deepspeed_cells(ci_run) -> None:
    _, records, _, log = ci_run
    seen = outcomes(records)
    assert seen[("0.19.2", "bug")] == "REPRODUCED", log
    assert seen[("0.19.8", "bug")] == "NOT_REPRODUCED", log
    assert seen[("0.19.2", "fixed")] == "PASS", log
    assert seen[("0.19.8", "fixed")] == "PASS", log


def test_records_carry_signature_metrics_and_a_rerun_command(ci_run) -> None:
    _, records, _, _ = ci_run
    ran = [r for r in records if r["outcome"] != "UNRESOLVABLE"]
    assert len(ran) == 4
    for r in ran:
        assert r["matched"] is True
        assert r["peak_mem_bytes"] > 50 * 2**20 and r["peak_mem_kind"] in ("cpu_peak_rss", "cuda_max_allocated")
        assert r["world_size"] == 2 and r["device"] in ("cpu", "cuda")
        assert "--repros F1" in r["repro_cmd"] and f"--cells {r['cell']}" in r["repro_cmd"]
        if r["mode"] == "fixed":
            assert r["step_time_s"]["n"] >= 2 and r["step_time_s"]["median"] > 0
            assert r["losses"][-1] < r["losses"][0]
    reproduced = next(r for r in ran if r["outcome"] == "REPRODUCED")
    assert reproduced["signature"] == "F1.recompute-shape-0"
    assert reproduced["error"]["type"] == "torch.utils.checkpoint.CheckpointError"
    guarded = next(r for r in ran if r["mode"] == "fixed" and r["versions"]["deepspeed"] == "0.19.2")
    assert "zero3-reentrant-checkpointing" in {g["id"] for g in guarded["guards"]}


def test_an_unresolvable_cell_is_reported_and_the_rest_still_runs(ci_run) -> None:
    code, records, out, _ = ci_run
    missing = [r for r in records if r["cell"] == "no-such-peft"]
    assert {r["mode"] for r in missing} == {"bug", "fixed"}
    assert all(r["outcome"] == "UNRESOLVABLE" for r in missing)
    assert "peft" in missing[0]["reasons"][0]
    assert code == 1  # an unresolvable cell observes nothing, so it cannot match
    run = json.loads((out / "run.json").read_text())
    assert "unavailable" in run["cells"]["no-such-peft"]


def test_rerun_reuses_the_environments(ci_run, tmp_path: Path) -> None:
    _, records, _, _ = ci_run
    shipped = REPO_ROOT / "matrix.yaml"
    cell = next(r["cell"] for r in records if r["versions"]["deepspeed"] == "0.19.8")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "run",
            "--matrix",
            str(shipped),
            "--cells",
            cell,
            "--repros",
            "F1",
            "--modes",
            "bug",
            "--out",
            str(tmp_path / "again"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (again,) = read_results(tmp_path / "again" / "results.jsonl")
    assert again["env"]["reused"] is True and again["outcome"] == "NOT_REPRODUCED"


def test_the_run_writes_junit_xml_with_a_testcase_per_item(ci_run) -> None:
    from junitparser import JUnitXml

    _, records, out, _ = ci_run
    suite = next(iter(JUnitXml.fromfile(str(out / "junit.xml"))))
    assert suite.tests == len(records) == 6
    assert suite.failures == 2  # the unresolvable cell's two items
