"""The benchmark for real, on two items: bare torchrun against the harness, same outcomes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO_ROOT

pytestmark = pytest.mark.integration


def test_bench_times_bare_torchrun_and_the_harness_with_identical_outcomes(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    command = [sys.executable, "-m", "harness", "bench", "--cells", "current", "--repros", "F1", "--rounds", "1"]
    command += ["--no-cold", "--no-jobs", "--out", str(out)]  # the cache: $FT_REGRESS_CACHE (--harness-cache)
    proc = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=1200, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((out / "bench.json").read_text())
    assert result["identical_outcomes"] is True
    assert {row["item"] for row in result["per_item"]} == {"current/F1/bug", "current/F1/fixed"}
    assert {o for row in result["per_item"] for o in row["outcomes"]} == {"NOT_REPRODUCED", "PASS"}
    # The work is under a second a step; bare torchrun pays the imports per item and per rank.
    assert result["ratio"] < 1.0, result
    # DeepSpeed's comm op is left unbuilt: no environment JIT-builds anything for these scenarios.
    assert all(ops == [] for ops in result["jit_ops_in_environments"].values())
    assert result["orchestrator_peak_rss_bytes"][0] > 0
    assert "ratio harness/bare" in proc.stdout and "identical outcomes" in proc.stdout
    outside = result["outside_items"][0]
    assert outside["items"] == 2 and 0 < outside["outside_items_s"] < outside["run_wall_s"]
    assert "time outside items" in proc.stdout
