"""A real bisect on CPU: F1's fix over DeepSpeed releases 0.19.2 .. 0.19.8."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO_ROOT

pytestmark = pytest.mark.integration


def test_bisect_names_the_first_deepspeed_release_with_the_f1_fix(tmp_path: Path) -> None:
    out = tmp_path / "bisect"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "bisect",
            "--repro",
            "F1",
            "--mode",
            "bug",
            "--package",
            "deepspeed",
            "--good",
            "0.19.8",
            "--bad",
            "0.19.2",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=3000,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    assert proc.stdout.strip().splitlines()[-1] == "first good: deepspeed==0.19.3", log
    steps = json.loads((out / "bisect.json").read_text())
    assert steps["kind"] == "fix" and steps["boundary"] == "0.19.3"
    assert steps["bad_signature"] == ["REPRODUCED", "F1.recompute-shape-0"]
    by_version = {s["point"]: s for s in steps["steps"]}
    assert by_version["0.19.2"]["state"] == "bad" and by_version["0.19.8"]["state"] == "good"
    assert by_version["0.19.3"]["state"] == "good"
    assert len(steps["steps"]) <= 2 + 3  # endpoints plus log2 of the five releases between
    # Every step left a full result record, with a command that reruns it alone.
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(records) == len(steps["steps"])
    assert all("--pin deepspeed==" in r["repro_cmd"] for r in records)


def test_by_date_resolves_the_stack_as_of_each_day(tmp_path: Path) -> None:
    from packaging.version import Version

    from harness.environments import UvEnvironments
    from harness.environments.index import pip_index_config

    builder = UvEnvironments(tmp_path, pip_index_config())
    then = builder.resolve(["deepspeed", "peft"], "3.11", "2026-06-01T00:00:00Z")
    now = builder.resolve(["deepspeed", "peft"], "3.11", None)
    assert Version(then["deepspeed"]) < Version(now["deepspeed"])
    assert Version(then["peft"]) <= Version(now["peft"])
