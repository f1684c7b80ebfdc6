"""`pytest --lane ci -n 2` for real, on a small subset: F1's bug mode in two cells that
share the ci lane's first environment (so nothing new is built), run side by side by
two xdist workers. Real torchrun launches at the same moment must not collide on a
port, and each item must record what `harness run` records."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.paths import REPO_ROOT, results_json

pytestmark = pytest.mark.integration


def test_two_workers_run_real_items_side_by_side(tmp_path: Path) -> None:
    shipped = yaml.safe_load((REPO_ROOT / "matrix.yaml").read_text())
    name, cell = next((n, c) for n, c in shipped["cells"].items() if "ci" in c.get("lanes", []))
    twin = {**cell, "lanes": ["ci"]}
    matrix = {**shipped, "cells": {name: twin, f"{name}-twin": twin}, "exclude": []}
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(matrix, sort_keys=False))
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-n",
            "2",
            f"--matrix={path}",
            "--lane=ci",
            "--repros=F1",
            "--modes=bug",
            f"--repro-out={out}",
            f"--junitxml={tmp_path / 'junit.xml'}",
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "2 passed" in proc.stdout
    records = results_json(out / "results.jsonl")
    assert {r["cell"] for r in records} == {name, f"{name}-twin"}
    assert all(r["matched"] and r["outcome"] not in ("INFRA", "HANG", "CRASH") for r in records), records
    assert records[0]["outcome"] == records[1]["outcome"]
    first, second = sorted(records, key=lambda r: r["started_at"])
    assert second["started_at"] <= first["finished_at"], "the two items ran one after the other"
    assert "--repros F1 --modes bug" in records[0]["repro_cmd"]
