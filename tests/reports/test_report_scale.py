"""The reports of a large run: the HTML report has every item in its tables, and plots that draw
at most ``PLOT_ITEMS`` items each and say so (a plot of 10,000 lines took minutes to draw and is
unreadable); JUnit counts its cases once, not once a case. Nothing here is timed: what grows with
the items is counted.
(``python -m tests.support.scale_figures report 10000`` prints the time and memory at scale.)"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from junitparser import JUnitXml, TestSuite

from harness.records.run_dir import RunDir
from harness.reports import html, junit
from harness.reports.finished import FinishedRun
from tests.support.report_fixture import write_run
from tests.support.report_page import report_data
from tests.support.scale_figures import synthetic_records

ITEMS = 300


# matplotlib warns (and draws empty axes) when a legend leaves a plot no room: forty items' names did.
@pytest.mark.filterwarnings("error::UserWarning")
def test_a_large_runs_plots_draw_the_first_items_and_its_tables_hold_every_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_run(tmp_path / "run-a", "run-a", "2026-11-19T10:00:00+00:00", synthetic_records(ITEMS, "run-a"))
    current = write_run(tmp_path / "run-b", "run-b", "2026-11-20T10:00:00+00:00", synthetic_records(ITEMS, "run-b"))
    drawn: dict[str, int] = {}

    def counting(name: str, plot: Any, size: Any) -> Any:
        def counted(arg: Any) -> Any:
            drawn[name] = size(arg)
            return plot(arg)

        return counted

    def history_size(runs: Sequence[Any]) -> int:
        return len({key for run in runs for key in run.records})

    for name, size in (
        ("fixed_trainer_plot", len),
        ("guard_cost_plot", len),
        ("costs_plot", len),
        ("history_plot", history_size),
    ):
        monkeypatch.setattr(html, name, counting(name, getattr(html, name), size))
    page = html.write(FinishedRun.load(RunDir(current))).read_text()
    assert drawn["history_plot"] == html.PLOT_ITEMS and max(drawn.values()) <= html.PLOT_ITEMS
    assert f"The plot shows the first {html.PLOT_ITEMS} of {ITEMS} items; the table has every one." in page
    # Every item is in the matrix (each cell has a mismatch: none is folded) and in the history,
    # where the items with the same outcome in both runs (all of them) are folded into one line.
    assert page.count('<details id="item-') == ITEMS
    assert not re.findall(r"<tr><th>cell\d+/R\d/", page)
    assert f"{ITEMS} items with the same outcome in every run" in page
    assert len(report_data(page)["history"]) == ITEMS


@pytest.mark.parametrize("items", [10, 200])
def test_junit_counts_its_cases_once_however_many_items(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, items: int
) -> None:
    counted: list[int] = []
    update = TestSuite.update_statistics

    def counting(self: TestSuite) -> None:
        counted.append(1)
        update(self)

    monkeypatch.setattr(TestSuite, "update_statistics", counting)
    run = write_run(tmp_path / "run", "run", "2026-11-20T10:00:00+00:00", synthetic_records(items, "run"))
    junit.write(FinishedRun.load(RunDir(run)))
    assert len(counted) <= 2  # not once a case: counting every case again at each was quadratic
    assert JUnitXml.fromfile(str(run / "junit.xml")).tests == items + 1  # and the excluded item
