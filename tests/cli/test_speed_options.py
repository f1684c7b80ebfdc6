"""The speed options on the command line: mistakes are one clear line and exit 2."""

from __future__ import annotations

import subprocess
import sys

from tests.support.paths import REPO_ROOT


def _harness(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=REPO_ROOT, capture_output=True, text=True)


def test_bench_with_no_rounds_is_a_usage_error_naming_the_option() -> None:
    proc = _harness("bench", "--rounds", "0")
    assert proc.returncode == 2
    assert "--rounds" in proc.stderr + proc.stdout and "Traceback" not in proc.stderr


def test_a_negative_or_wordy_jobs_is_refused_before_anything_runs() -> None:
    for bad in ("-1", "many"):
        proc = _harness("run", "--jobs", bad)
        assert proc.returncode == 2 and "--jobs takes a whole number" in proc.stderr


def test_an_unknown_launcher_is_refused_with_the_choices() -> None:
    proc = _harness("run", "--launcher", "mpirun")
    assert proc.returncode == 2 and "worker" in proc.stderr and "torchrun" in proc.stderr
