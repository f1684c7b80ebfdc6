"""The benchmark's "time outside items": a run's wall less its items' own walls, split by where the
records' times put it (before the first item, inside item spans, between items of a cell and
between cells, after the last one, the process around ``run.json``'s times)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.items import time_outside_items
from tests.support.report_fixture import _record, write_run


def at(second: int) -> str:
    return f"2026-11-20T10:{second // 60:02d}:{second % 60:02d}+00:00"


def test_a_runs_time_outside_its_items_is_split_where_the_records_put_it(tmp_path: Path) -> None:
    recs = [
        # current: a worker start (15 s) inside the first item's span; 1 s between its items
        _record("current", "F1", "bug", "PASS", wall_s=4.0, started_at=at(5), finished_at=at(25)),
        _record("current", "F1", "fixed", "PASS", wall_s=3.0, started_at=at(26), finished_at=at(30)),
        # ds-0.19.2: 6 s to change cells
        _record("ds-0.19.2", "F1", "bug", "PASS", wall_s=5.0, started_at=at(36), finished_at=at(42)),
    ]
    run = write_run(tmp_path / "run", "run-a", at(0), recs)
    meta = json.loads((run / "run.json").read_text())
    meta["finished_at"] = at(50)
    meta["cells"]["current"]["worker"] = {"start_s": 15.0}
    (run / "run.json").write_text(json.dumps(meta))

    found = time_outside_items(run, wall_s=52.0)
    assert found["items"] == 3 and found["items_wall_s"] == 12.0
    assert found["outside_items_s"] == 40.0 and found["per_item_outside_s"] == pytest.approx(40.0 / 3)
    split = found["split"]
    assert split["before_first_item_s"] == 5.0
    assert split["in_item_spans_outside_walls_s"] == (20 - 4) + (4 - 3) + (6 - 5)
    assert split["of_which_worker_starts_s"] == 15.0
    assert split["between_items_same_cell_s"] == 1.0
    assert split["between_items_cell_change_s"] == 6.0
    assert split["after_last_item_s"] == 8.0
    assert split["process_start_and_exit_s"] == 2.0
    parts = [k for k in split if k not in ("of_which_worker_starts_s", "environments_built_s")]
    assert sum(split[k] for k in parts) == found["outside_items_s"]  # the parts add up
    assert split["environments_built_s"] == 42.0


def test_without_the_process_wall_run_json_times_are_the_runs(tmp_path: Path) -> None:
    recs = [_record("current", "F1", "bug", "PASS", wall_s=4.0, started_at=at(5), finished_at=at(10))]
    run = write_run(tmp_path / "run", "run-a", at(0), recs)
    meta = json.loads((run / "run.json").read_text())
    meta["finished_at"] = at(12)
    (run / "run.json").write_text(json.dumps(meta))
    found = time_outside_items(run)
    assert found["run_wall_s"] == 12.0 and found["outside_items_s"] == 8.0
    assert found["split"]["process_start_and_exit_s"] is None
