"""``run --reruns N``: an item that contradicts its expectation runs again, every attempt kept,
and one that matched only on a rerun is reported flaky, never as a plain pass or a regression."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from junitparser import JUnitXml

from harness.records.results import read_results
from tests.support import fake_stack
from tests.support.paths import REPO_ROOT


def run(root: Path, env: dict[str, str], repro: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "run",
            "--matrix",
            str(root / "matrix.yaml"),
            "--repros-dir",
            str(root / "repros"),
            "--repros",
            repro,
            "--out",
            str(root / "out"),
            *args,
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def stack(tmp_path: Path, behaviour: str, expected: str) -> dict[str, str]:
    env = fake_stack.run_env(fake_stack.install(tmp_path))
    fake_stack.write_repro(tmp_path / "repros", "R1", behaviour, expected)
    fake_stack.write_matrix(tmp_path / "matrix.yaml", ["a"])
    return env


def junit_case(out: Path) -> str:
    xml = JUnitXml.fromfile(str(out / "junit.xml"))
    return next(iter(next(iter(xml)))).tostring().decode()


def test_an_item_that_matches_on_a_rerun_is_flaky_with_its_first_attempt_kept(tmp_path: Path) -> None:
    env = stack(tmp_path, "flaky", "REPRODUCED")
    done = run(tmp_path, env, "R1", "--reruns", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    [record] = read_results(tmp_path / "out" / "results.jsonl")
    assert record.outcome == "REPRODUCED" and record.matched and record.flaky
    [first] = record.attempts
    assert first.outcome == "DIFFERENT_ERROR" and first.error_type == "KeyError"
    assert first.item_dir is not None
    kept = Path(first.item_dir)
    assert kept.name == "R1-bug.attempt-1" and json.loads((kept / "rank0.json").read_text())["status"] == "error"
    assert any(r.startswith("flaky: attempt 1 observed DIFFERENT_ERROR") for r in record.reasons)
    assert "flaky: DIFFERENT_ERROR first, matched on attempt 2" in done.stdout
    case = junit_case(tmp_path / "out")
    assert "<flakyFailure" in case and "<failure" not in case
    assert json.loads((tmp_path / "out" / "run.json").read_text())["options"]["reruns"] == 1


def test_without_reruns_the_same_item_is_a_missed_expectation(tmp_path: Path) -> None:
    env = stack(tmp_path, "flaky", "REPRODUCED")
    done = run(tmp_path, env, "R1")
    assert done.returncode == 1
    [record] = read_results(tmp_path / "out" / "results.jsonl")
    assert record.outcome == "DIFFERENT_ERROR" and record.attempts == [] and "attempts" not in record.as_json()


def test_an_item_that_never_matches_runs_n_more_times_and_still_fails(tmp_path: Path) -> None:
    env = stack(tmp_path, "other", "REPRODUCED")
    done = run(tmp_path, env, "R1", "--reruns", "2")
    assert done.returncode == 1
    [record] = read_results(tmp_path / "out" / "results.jsonl")
    assert not record.matched and not record.flaky
    assert [a.outcome for a in record.attempts] == ["DIFFERENT_ERROR", "DIFFERENT_ERROR"]
    assert sorted(p.name for p in (tmp_path / "out" / "items" / "a").iterdir()) == [
        "R1-bug",
        "R1-bug.attempt-1",
        "R1-bug.attempt-2",
    ]
    case = junit_case(tmp_path / "out")
    assert case.count("<rerunFailure") == 2 and "<failure" in case


def test_a_matching_item_is_never_rerun_and_a_negative_count_is_refused(tmp_path: Path) -> None:
    env = stack(tmp_path, "clean", "NOT_REPRODUCED")
    done = run(tmp_path, env, "R1", "--reruns", "3")
    assert done.returncode == 0
    [record] = read_results(tmp_path / "out" / "results.jsonl")
    assert record.attempts == [] and "attempts" not in record.as_json()
    refused = run(tmp_path, env, "R1", "--reruns", "-1")
    assert refused.returncode == 2
    assert "--reruns takes a whole number (0 or more), not '-1'" in refused.stderr
