"""Other runs of a reports directory are read defensively: one record with a field of the wrong
type (or an outcome that does not exist, or JSON Python will not read) in another run is left out
of the history and named, with its line and field; the rest of that run stays in the history, the
current run's report is written, and the shards' balance leaves it out too, saying so in run.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from harness.planning.shards import Shard, durations_from, shard_meta
from harness.records.item import ItemRecord, RecordError, parse_record
from harness.records.run_dir import RunDir
from harness.reports import html
from harness.reports.finished import FinishedRun
from harness.reports.history import load_history
from tests.support.report_fixture import records, write_reports, write_run

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
FIELDS = sorted(ItemRecord.model_fields)


def _valid(record: dict[str, Any]) -> bool:
    try:
        parse_record(record)
    except RecordError:
        return False
    return True


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(FIELDS), value=json_values)
@example(field="expected_when", value={"\n": None})  # a key holding a line break, found by Hypothesis in CI
def test_a_wrongly_typed_record_in_another_run_is_left_out_and_named_never_trusted(
    tmp_path_factory: Any, field: str, value: Any
) -> None:
    reports = Path(tmp_path_factory.mktemp("reports"))
    current = write_reports(reports)
    older = records("run-0")
    older[1] = {**older[1], field: value}
    write_run(reports / "run-0", "run-0", "2026-11-18T10:00:00+00:00", older)
    skipped: list[str] = []
    runs = load_history(current, skipped=skipped)
    assert [r.name for r in runs] == ["run-0", "run-a", "run-b"]
    kept = runs[0].records
    if _valid(older[1]):
        assert len(kept) == len(older) and skipped == []
    else:
        # That record alone is left out, named by its file, line and field; the run's others stay.
        (said,) = skipped
        assert "run-0/results.jsonl: line 2: " in said and field in said and "\n" not in said
        assert len(kept) == len(older) - 1
    walls = durations_from(reports)
    assert len(walls.skipped) == len(skipped)
    meta = shard_meta(Shard(1, 2), sorted(walls), sorted(walls)[:1], walls, reports)
    assert meta.balanced_by.get("left_out", []) == walls.skipped


def test_the_report_is_written_whatever_the_runs_beside_it_hold(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    current = write_reports(reports)
    good = records("x")
    # A record with a field of the wrong type, one with an outcome that does not exist, a number
    # Python will not read, a run.json nested too deep, a run.json of the wrong shape.
    write_run(reports / "bad-wall", "bad-wall", "2026-11-10", [{**good[0], "wall_s": "slow"}, *good[1:]])
    write_run(reports / "bad-outcome", "bad-outcome", "2026-11-11", [*good[:-1], {**good[-1], "outcome": "GREAT"}])
    write_run(reports / "big-number", "big-number", "2026-11-12", good)
    with open(reports / "big-number" / "results.jsonl", "a") as fh:
        fh.write('{"schema_version": 1, "cell": "c", "wall_s": ' + "9" * 5000 + "}\n")
    write_run(reports / "deep-meta", "deep-meta", "2026-11-13", good)
    (reports / "deep-meta" / "run.json").write_text('{"run_id": ' + "[" * 50_000 + "]" * 50_000 + "}")
    write_run(reports / "list-meta", "list-meta", "2026-11-14", good)
    (reports / "list-meta" / "run.json").write_text("[1, 2]")
    # A merge cut short leaves its hidden staging directory: it is no run.
    write_run(reports / ".merged.merging-123", "staging", "2026-11-15", good[:2])

    page = html.write(FinishedRun.load(RunDir(current))).read_text()
    assert "bad-wall/results.jsonl: line 1: field wall_s" in page
    assert "bad-outcome/results.jsonl: line 8: field outcome" in page
    assert "big-number/results.jsonl: line 9: is not JSON" in page
    assert "deep-meta/run.json" in page and "list-meta/run.json" in page
    assert "staging" not in page and ".merging-" not in page
    runs = load_history(current)
    assert [r.name for r in runs] == ["bad-wall", "bad-outcome", "big-number", "run-a", "run-b"]
    assert len(runs[0].records) == len(good) - 1 and len(runs[1].records) == len(good) - 1
    assert len(durations_from(reports).skipped) == 3
    assert json.loads(json.dumps(sorted(durations_from(reports))))  # read, not crashed
