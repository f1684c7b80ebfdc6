"""What a run that built environments says it cost as it ends: its wall split into the environments
(no item could run), the items and the rest, and beside it the physical floor, the CPU seconds of
the work itself over the cores."""

from __future__ import annotations

from harness.records.run_meta import RunMeta
from harness.reports.run_cost import RunCost
from tests.support.report_fixture import _record, typed


def first_run(jobs: int = 1) -> RunMeta:
    return RunMeta.model_validate(
        {
            "started_at": "2026-11-20T10:00:00+00:00",
            "finished_at": "2026-11-20T10:05:00+00:00",
            "options": {"jobs": jobs},
            "environment_stage": {"waited_s": 95.0},
            "cells": {
                "current": {"reused": False, "build_s": 90.0, "build_cpu_s": 120.0, "worker": {"cpu_s": 15.0}},
                "ds-0.19.2": {"reused": False, "build_s": 40.0, "build_cpu_s": 50.0, "worker": {"cpu_s": 14.0}},
                "tf4": {"reused": True, "build_s": 0.0, "worker": {"cpu_s": 16.0}},
            },
        }
    )


def items() -> list:
    return typed(
        [
            _record(
                "current",
                "F1",
                "bug",
                "NOT_REPRODUCED",
                wall_s=60.0,
                cpu_s=100.0,
                started_at="2026-11-20T10:01:40+00:00",
                finished_at="2026-11-20T10:02:40+00:00",
            ),
            _record(
                "ds-0.19.2",
                "F1",
                "bug",
                "REPRODUCED",
                wall_s=80.0,
                cpu_s=130.0,
                started_at="2026-11-20T10:02:00+00:00",
                finished_at="2026-11-20T10:03:20+00:00",
            ),
        ]
    )


def test_a_first_run_says_where_its_wall_went_and_the_least_the_work_could_take() -> None:
    cost = RunCost.of(first_run(), items(), cores=2)
    assert (cost.wall_s, cost.environments_s, cost.items_s, cost.rest_s) == (300.0, 95.0, 140.0, 65.0)
    assert (cost.install_cpu_s, cost.imports_cpu_s, cost.items_cpu_s) == (170.0, 45.0, 230.0)
    assert cost.floor_s == 222.5
    split, floor = cost.lines()
    assert split == (
        "this run, building 2 environments: 300 s = environments 95 s (no item could run yet) + items 140 s "
        "+ the rest 65 s (workers starting, checks, records, reports)"
    )
    assert floor.startswith(
        "the work itself: 445 CPU-s (downloads and installs 170, the cells' imports 45, the items 230)"
    )
    assert "over 2 cores: 222 s at the least" in floor


def test_items_run_side_by_side_count_once_in_the_split() -> None:
    cost = RunCost.of(first_run(jobs=2), items(), cores=2)
    assert cost.items_s == 100.0  # 10:01:40 .. 10:03:20, the two spans overlapping
