"""A lane run through ``python -m harness run`` in a subprocess, the same way for every executor's
real test (Ray, submitit, a real Slurm): the selection, the records it wrote, its outcomes by item."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.paths import REPO_ROOT

#: Four quick items of the current releases: enough for two nodes to have work when one dies.
SELECTION = ["--cells", "current", "--repros", "F1,F3", "--modes", "bug,fixed"]
#: Ray on loopback only, for the cluster, its workers and the driver.
LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def harness_run(out: Path, *more: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "harness", "run", "--matrix", str(REPO_ROOT / "matrix.yaml"), *SELECTION]
    return subprocess.Popen(
        [*command, "--out", str(out), *more],
        cwd=REPO_ROOT,
        env={**os.environ, **LOOPBACK},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]


def item_key(record: dict) -> tuple[str, str, str]:
    return record["cell"], record["repro"], record["mode"]


def outcomes(found: list[dict]) -> dict[tuple[str, str, str], str]:
    return {item_key(r): r["outcome"] for r in found}
