"""``run --repeat N``: every item runs N times and every attempt is recorded; attempts that disagree
make the item FLAKY, with the count of each outcome as the evidence, never silently the last one."""

from __future__ import annotations

import json
from pathlib import Path

from junitparser import JUnitXml

from harness.records.results import read_results
from tests.pipeline.test_reruns import junit_case, run, stack


def test_attempts_that_disagree_make_the_item_flaky_with_the_count_of_each_outcome(tmp_path: Path) -> None:
    env = stack(tmp_path, "flaky", "REPRODUCED")  # each rank: a different error first, then the signature
    done = run(tmp_path, env, "R1", "--repeat", "3", "--modes", "bug")
    assert done.returncode == 1, done.stdout + done.stderr
    [record] = read_results(tmp_path / "out" / "results.jsonl")
    assert record.outcome == "FLAKY" and not record.matched and record.expected == "REPRODUCED"
    assert record.repeat == 3 and record.outcome_counts == {"REPRODUCED": 2, "DIFFERENT_ERROR": 1}
    assert [a.outcome for a in record.attempts] == ["DIFFERENT_ERROR", "REPRODUCED", "REPRODUCED"]
    assert record.reasons[0] == "attempts disagree: 2 REPRODUCED, 1 DIFFERENT_ERROR (attempts 1 not REPRODUCED)"
    assert record.error is not None  # the first error met: the evidence, not the last attempt's silence
    # Every attempt's directory is kept: the earlier ones beside the item's, the last in its place.
    items = tmp_path / "out" / "items" / "a"
    assert sorted(p.name for p in items.iterdir()) == ["R1-bug", "R1-bug.attempt-1", "R1-bug.attempt-2"]
    assert [a.item_dir for a in record.attempts] == [
        str(items / n) for n in ("R1-bug.attempt-1", "R1-bug.attempt-2", "R1-bug")
    ]
    assert "FLAKY" in done.stdout and "2 REPRODUCED, 1 DIFFERENT_ERROR of 3" in done.stdout
    case = junit_case(tmp_path / "out")
    assert "<failure" in case and case.count("<rerunFailure") == 1 and "3 attempts: 2 REPRODUCED" in case
    page = (tmp_path / "out" / "index.html").read_text()
    assert "2 REPRODUCED, 1 DIFFERENT_ERROR of 3" in page and "o-FLAKY" in page
    on_disk = json.loads((tmp_path / "out" / "results.jsonl").read_text())
    assert on_disk["outcome_counts"] == {"REPRODUCED": 2, "DIFFERENT_ERROR": 1} and len(on_disk["attempts"]) == 3


def test_attempts_that_agree_keep_the_outcome_and_say_how_many_ran(tmp_path: Path) -> None:
    env = stack(tmp_path, "raise", "REPRODUCED")
    done = run(tmp_path, env, "R1", "--repeat", "3", "--modes", "bug")
    assert done.returncode == 0, done.stdout + done.stderr
    [record] = read_results(tmp_path / "out" / "results.jsonl")
    assert record.outcome == "REPRODUCED" and record.matched and record.signature
    assert record.repeat == 3 and record.outcome_counts == {"REPRODUCED": 3} and len(record.attempts) == 3
    suite = next(iter(JUnitXml.fromfile(str(tmp_path / "out" / "junit.xml"))))
    assert suite.failures == 0 and "3 attempts: 3 REPRODUCED" in junit_case(tmp_path / "out")


def test_repeat_and_reruns_together_or_zero_attempts_are_refused(tmp_path: Path) -> None:
    env = stack(tmp_path, "raise", "REPRODUCED")
    both = run(tmp_path, env, "R1", "--repeat", "3", "--reruns", "1")
    assert both.returncode == 2 and "cannot be combined with --reruns" in both.stderr
    none = run(tmp_path, env, "R1", "--repeat", "0")
    assert none.returncode == 2 and "--repeat takes a whole number (1 or more), not '0'" in none.stderr
    assert not (tmp_path / "out" / "results.jsonl").exists()
