"""The executor benchmark's figures from a run's records: items per minute over the run's wall, and
the time outside the items (the run's fixed cost), per executor."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.executors import figures


def test_items_per_minute_and_the_time_outside_items_come_from_the_records(tmp_path: Path) -> None:
    records = [
        {"wall_s": 4.0, "matched": True, "node": "vm/a1"},
        {"wall_s": 6.0, "matched": True, "node": "vm/b2"},
        {"wall_s": 5.0, "matched": False, "node": "vm/a1"},
    ]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    found = figures("ray, 2 nodes", 30.0, tmp_path)
    assert found.items == 3 and found.items_per_minute == 6.0
    assert found.items_wall_s == 15.0 and found.outside_items_s == 15.0
    assert found.matched == 2 and found.nodes == ["vm/a1", "vm/b2"]
