"""``watch`` end to end on the stand-in stack: two nights, an item whose outcome changed with
nothing moved under it, confirmed by reruns (or not: flaky), written to changes.json, the markdown
summary, index.html and junit.xml, and the exit status."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from junitparser import JUnitXml

from harness.records.changes import read_changes
from tests.support import fake_stack
from tests.support.paths import REPO_ROOT


def harness(root: Path, env: dict[str, str], verb: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            verb,
            "--matrix",
            str(root / "matrix.yaml"),
            "--repros-dir",
            str(root / "repros"),
            *args,
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def two_nights(tmp_path: Path, tonight: str) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    env = fake_stack.run_env(fake_stack.install(tmp_path))
    fake_stack.write_matrix(tmp_path / "matrix.yaml", ["a"])
    fake_stack.write_repro(tmp_path / "repros", "R1", "clean", "NOT_REPRODUCED")
    first = harness(tmp_path, env, "run", "--out", str(tmp_path / "n1"))
    assert first.returncode == 0, first.stdout + first.stderr
    fake_stack.write_repro(tmp_path / "repros", "R1", tonight, "NOT_REPRODUCED")
    env["GITHUB_STEP_SUMMARY"] = str(tmp_path / "step-summary.md")
    watch = harness(
        tmp_path,
        env,
        "watch",
        "--previous",
        str(tmp_path / "n1"),
        "--out",
        str(tmp_path / "n2"),
        "--no-update-expectations",
    )
    return watch, env


def test_a_change_with_nothing_moved_that_holds_on_reruns_is_a_regression(tmp_path: Path) -> None:
    done, _ = two_nights(tmp_path, "raise")
    assert done.returncode == 1, done.stdout + done.stderr
    (change,) = read_changes(tmp_path / "n2") or []
    assert (change.cell, change.repro, change.mode) == ("a", "R1", "bug")
    assert (change.before, change.after, change.verdict) == ("NOT_REPRODUCED", "REPRODUCED", "regressed")
    assert change.moved == {} and change.culprit is None
    assert "3 more runs showed it every time" in change.reason
    # Its reruns are a run of their own, inside the watch run.
    assert change.evidence["attempts"] == {"REPRODUCED": 3}
    assert (tmp_path / "n2" / "watch" / "a" / "R1-bug" / "confirm" / "results.jsonl").is_file()
    summary = (tmp_path / "step-summary.md").read_text()
    assert "**1 regressed**" in summary and "| a/R1/bug |" in summary
    assert (tmp_path / "n2" / "changes.md").read_text() in summary
    page = (tmp_path / "n2" / "index.html").read_text()
    assert "Changes since the previous night" in page and "verdict-regressed" in page
    suites = list(JUnitXml.fromfile(str(tmp_path / "n2" / "junit.xml")))
    watched = next(s for s in suites if "watch" in str(s.name))
    case = next(iter(watched))
    assert case.classname == "watch.a" and not case.is_passed
    run_json = json.loads((tmp_path / "n2" / "run.json").read_text())
    assert run_json["watch"]["verdicts"]["regressed"] == 1 and run_json["kind"] == "watch"


def test_a_change_that_does_not_hold_on_reruns_is_flaky_and_fails_nothing(tmp_path: Path) -> None:
    # "flaky": KeyError (DIFFERENT_ERROR) the first time each rank runs it, the documented symptom after.
    done, _ = two_nights(tmp_path, "flaky")
    assert done.returncode == 0, done.stdout + done.stderr
    (change,) = read_changes(tmp_path / "n2") or []
    assert change.after == "DIFFERENT_ERROR" and change.verdict == "flaky"
    assert "did not show DIFFERENT_ERROR every time" in change.reason
    suites = list(JUnitXml.fromfile(str(tmp_path / "n2" / "junit.xml")))
    watched = next(s for s in suites if "watch" in str(s.name))
    assert all(case.is_passed for case in watched)


def test_nothing_changed_is_said_and_exits_0(tmp_path: Path) -> None:
    done, _ = two_nights(tmp_path, "clean")
    assert done.returncode == 0, done.stdout + done.stderr
    assert read_changes(tmp_path / "n2") == []
    assert "No item changed its outcome." in done.stdout


@pytest.mark.parametrize(
    "previous, words",
    [("missing", "is not a directory"), ("empty", "holds no results.jsonl")],
)
def test_a_previous_night_that_is_not_a_run_is_refused_with_exit_2(tmp_path: Path, previous: str, words: str) -> None:
    env = fake_stack.run_env(fake_stack.install(tmp_path))
    fake_stack.write_matrix(tmp_path / "matrix.yaml", ["a"])
    fake_stack.write_repro(tmp_path / "repros", "R1", "clean", "NOT_REPRODUCED")
    (tmp_path / "empty").mkdir()
    done = harness(tmp_path, env, "watch", "--previous", str(tmp_path / previous), "--out", str(tmp_path / "n2"))
    assert done.returncode == 2 and words in done.stderr and "--previous" in done.stderr
    assert not (tmp_path / "n2").exists()
