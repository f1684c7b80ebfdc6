"""Reading ``results.jsonl``: an outcome that does not exist is refused, naming the line and the
field (or, where another run's file is read for the history, left out and named); an item recorded
twice in a run is counted once, the last whole record, and said; no JSON a file can hold crashes
the reader."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.core.errors import UserError
from harness.records.changes import CHANGES_FILE, ChangesFileError, read_changes
from harness.records.results import Records, read_results
from harness.records.run_dir import RunDir
from harness.reports import html
from harness.reports.finished import FinishedRun
from repros.runtime.outcomes import Outcome
from tests.records.test_results import record_line
from tests.support.report_fixture import records, write_run

not_an_outcome = st.text(max_size=20).filter(lambda t: t not in Outcome.__members__)
#: Each place a record holds an outcome, and the field the refusal names.
PLACES = {
    "outcome": lambda bad: {"outcome": bad},
    "expected": lambda bad: {"expected": bad},
    "attempts": lambda bad: {"attempts": [{"outcome": "PASS"}, {"outcome": bad}]},
    "outcome_counts": lambda bad: {"repeat": 2, "outcome_counts": {"PASS": 1, bad: 1}},
}
FIELD_NAMED = {
    "outcome": "outcome",
    "expected": "expected",
    "attempts": "attempts.1.outcome",
    "outcome_counts": "outcome_counts",
}


def _write(path: Path, lines: list[Any]) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


settings_ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@settings_
@given(place=st.sampled_from(sorted(PLACES)), bad=not_an_outcome, position=st.integers(0, 3))
def test_an_outcome_that_does_not_exist_is_refused_naming_the_line_and_the_field(
    tmp_path: Path, place: str, bad: str, position: int
) -> None:
    lines: list[Any] = [record_line(n) for n in range(4)]
    lines[position] = {**lines[position], **PLACES[place](bad)}
    path = _write(tmp_path / "results.jsonl", lines)
    with pytest.raises(UserError) as refused:
        read_results(path)
    line = str(refused.value)
    assert f"line {position + 1}" in line and f"field {FIELD_NAMED[place]}" in line
    assert "\n" not in line
    # Read leniently (another run's file), that line alone is left out, and named.
    lenient = read_results(path, lenient=True)
    assert [r.cell for r in lenient] == [f"c{n}" for n in range(4) if n != position]
    (skipped,) = lenient.skipped
    assert f"line {position + 1}" in skipped and FIELD_NAMED[place].split(".")[0] in skipped


#: Values Python's JSON reader refuses although a file can hold them.
UNREADABLE = ['{"schema_version": 1, "n": ' + "1" * 5000 + "}", "[" * 100_000 + "]" * 100_000, '{"a": "\\ud800"}']


@pytest.mark.parametrize("text", UNREADABLE, ids=["a 5000-digit number", "nested 100000 deep", "a lone surrogate"])
def test_no_line_crashes_the_reader(tmp_path: Path, text: str) -> None:
    path = _write(tmp_path / "results.jsonl", [record_line(1), text, record_line(2)])
    try:
        read_results(path)
    except UserError as exc:
        assert "line 2" in str(exc)
    assert [r.cell for r in read_results(path, lenient=True)] == ["c1", "c2"]


keys = st.tuples(st.sampled_from(["c1", "c2"]), st.sampled_from(["F1", "F2"]), st.sampled_from(["r1", "r2"]))


@settings_
@given(written=st.lists(keys, min_size=1, max_size=12))
def test_an_item_recorded_twice_in_a_run_is_counted_once_the_last_record_and_said(
    tmp_path: Path, written: list[tuple[str, str, str]]
) -> None:
    lines = [{**record_line(n), "cell": c, "repro": r, "run_id": run} for n, (c, r, run) in enumerate(written)]
    path = _write(tmp_path / "results.jsonl", lines)
    records = read_results(path)
    unique = list(dict.fromkeys(written))
    # One record per item of a run, where the item first appeared, with what its last line says.
    assert [(r.cell, r.repro, r.run_id) for r in records] == unique
    last = {key: n for n, key in enumerate(written)}
    assert [r.as_json()["n"] for r in records] == [last[key] for key in unique]
    assert len(records.duplicates) == len(written) - len(unique)
    for note in records.duplicates:
        assert str(path) in note and "again" in note and "counted once" in note
    assert isinstance(RunDir(tmp_path).records(), Records)


def test_the_same_item_in_two_runs_of_one_file_is_two_records(tmp_path: Path) -> None:
    # A merged run holds each shard's records under its own run id: nothing is a repeat there.
    path = _write(tmp_path / "results.jsonl", [{**record_line(1), "run_id": "a"}, {**record_line(1), "run_id": "b"}])
    records = read_results(path)
    assert len(records) == 2 and records.duplicates == []


@pytest.mark.parametrize(
    ("field", "value"),
    [("before", "GREAT"), ("after", "pass"), ("verdict", "worse")],
    ids=["before", "after", "verdict"],
)
def test_a_change_naming_an_outcome_or_verdict_that_does_not_exist_is_refused_naming_the_entry(
    tmp_path: Path, field: str, value: str
) -> None:
    change = {"cell": "c", "repro": "F1", "mode": "bug", "before": "PASS", "after": "FAIL", "verdict": "regressed"}
    (tmp_path / CHANGES_FILE).write_text(json.dumps([change, {**change, field: value}]))
    with pytest.raises(ChangesFileError) as refused:
        read_changes(tmp_path)
    assert f"entry 1 ({field})" in str(refused.value)
    # The report of that run still comes, saying what is wrong with its changes.
    write_run(tmp_path, "run", "2026-11-20T10:00:00+00:00", records("run"))
    page = html.write(FinishedRun.load(RunDir(tmp_path))).read_text()
    assert f"entry 1 ({field})" in page
