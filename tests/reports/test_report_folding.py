"""The HTML report at scale: a cell whose every item matched (and did not change since the
previous run) folded into one line, the excluded combinations and the history's unchanged items
folded too, filters by repro, cell, family and outcome, natural order, and a page of 10,000 items
that stays small (its details are data, made into markup when opened). In a real Chromium where
there is one: the filters hide what they should, and a link opens a folded item.
(``python -m harness bench report --items 10000`` prints the time, size and opening time.)"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from benchmarks import report_page as report_scale
from harness.records.run_dir import RunDir
from harness.reports import html
from harness.reports.finished import FinishedRun
from tests.reports.test_report_chromium import CHROMIUM, chromium
from tests.support.report_fixture import records, write_run
from tests.support.report_page import item_facts, item_key, report_data

needs_chromium = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM}")


def _copy(rec: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {**rec, **fields, "repro_cmd": f"{rec['repro_cmd']} ({fields.get('cell', '')})"}


def two_runs(root: Path) -> Path:
    """The fixture's run (each of its cells has an item that did not match) and the one before it,
    with three more cells: ``c9`` and ``c10``, every item matched and unchanged (folded), and
    ``moved``, every item matched but one changed since the previous run (not folded)."""
    runs = {}
    for run_id in ("run-a", "run-b"):
        recs = records(run_id)
        good = [r for r in recs if r["cell"] == "current" and r["repro"] == "F1"]
        extra = [_copy(r, cell=c) for c in ("c10", "c9") for r in good]
        moved = [_copy(r, cell="moved") for r in good]
        if run_id == "run-a":
            moved[0] = {**moved[0], "outcome": "REPRODUCED", "expected": "REPRODUCED", "signature": "F1.old"}
        runs[run_id] = recs + extra + moved
    write_run(root / "run-a", "run-a", "2026-11-19T10:00:00+00:00", runs["run-a"])
    return write_run(root / "run-b", "run-b", "2026-11-20T10:00:00+00:00", runs["run-b"])


def page_of(run: Path) -> str:
    return html.write(FinishedRun.load(RunDir(run))).read_text()


def folded_cells(page: str) -> dict[str, str]:
    """Each folded cell's line: cell -> its summary's text."""
    found = re.findall(
        r'<details class="folded-cell" id="cell-\d+" data-cell="([^"]*)" data-family="[^"]*">\s*'
        r"<summary><strong>[^<]*</strong> — ([^<]*)</summary>",
        page,
    )
    return dict(found)


def matrix_columns(page: str) -> list[str]:
    head = page.split('<table id="matrix">', 1)[1].split("</thead>", 1)[0]
    return re.findall(r'<th data-cell="([^"]*)"', head)


def test_a_cell_whose_every_item_matched_and_did_not_change_is_one_line_that_opens(tmp_path: Path) -> None:
    page = page_of(two_runs(tmp_path))
    # Folded: closed by default, one line each, in natural order (c9 before c10).
    assert folded_cells(page) == {
        "c9": "2 items, all matched their expectation, unchanged since run-a",
        "c10": "2 items, all matched their expectation, unchanged since run-a",
    }
    assert list(folded_cells(page)) == ["c9", "c10"]
    assert not re.search(r'<details class="folded-cell"[^>]* open', page)
    # Not in the table; a cell with a mismatch, or with an item that changed, is.
    assert matrix_columns(page) == ["current", "ds-0.19.2", "moved", "tf4"]
    # Opening one makes its rows from the data: each item, with its details.
    data = report_data(page)
    for cell in ("c9", "c10"):
        items = data["folded"][cell]["items"]
        assert [item_key(data, i) for i in items] == [
            (cell, "F1", "bug", "NOT_REPRODUCED"),
            (cell, "F1", "fixed", "PASS"),
        ]
        assert (
            f"--cells current --repros F1 --modes bug ({cell})"
            in dict((label, value) for label, value, _ in item_facts(page, items[0], data))["rerun"]
        )
    # Nothing of the folded items is markup until it is opened.
    assert page.count('<details id="item-') == len(data["items"]) - 4


def test_excluded_combinations_and_the_historys_unchanged_items_are_folded(tmp_path: Path) -> None:
    page = page_of(two_runs(tmp_path))
    excluded = page.split('<details id="excluded-items">', 1)[1].split("</details>", 1)[0]
    assert "1 excluded combination " in excluded
    assert re.search(r"<td>tf4</td><td>F1 / fixed</td><td>needs transformers 5 \(&lt;i&gt;see", excluded)
    # In the table the square says excluded, its reason in its title.
    assert '<td class="entry o-excluded" data-cell="tf4"' in page
    # The history: what moved between the runs in its table, the rest one line.
    history = page.split('<section id="history">', 1)[1]
    moved = re.findall(r"<tr><th>([^<]+)</th>", history)
    assert moved == ["item", "moved/F1/bug"]  # the header, and the one item whose outcome moved
    data = report_data(page)
    same = {data["strings"][label] for label, _ in data["history"]}
    assert len(same) == len(data["items"]) - 1 and "c9/F1/bug" in same and "moved/F1/bug" not in same
    assert f"{len(same)} items with the same outcome in every run" in history


def test_the_filters_offer_every_repro_cell_family_and_outcome_and_mark_what_they_select(tmp_path: Path) -> None:
    recs = records("run-b")
    recs += [_copy(r, repro=rep) for rep in ("F10", "F3") for r in recs if r["repro"] == "F2"]
    llama = [{**r, "cell": f"{r['cell']}@llama", "family": "llama", "family_of": r["cell"]} for r in recs]
    page = page_of(write_run(tmp_path / "run", "run", "2026-11-20T10:00:00+00:00", recs + llama))

    def options(name: str) -> list[str]:
        select = page.split(f'id="{name}-filter"', 1)[1].split("</select>", 1)[0]
        return re.findall(r'<option value="([^"]*)">', select)

    assert options("repro") == ["", "F1", "F2", "F3", "F10"]  # natural order
    assert options("cell") == ["", "current", "current@llama", "ds-0.19.2", "ds-0.19.2@llama", "tf4", "tf4@llama"]
    assert options("family") == ["", "llama", "qwen2"]
    # The outcomes the run has, in the vocabulary's order, and the excluded combinations.
    outcomes = ["REPRODUCED", "NOT_REPRODUCED", "DIFFERENT_ERROR", "PASS", "FAIL", "UNRESOLVABLE"]
    assert options("outcome") == ["", *outcomes, "excluded"]
    # What the script filters on: each row's repro, each square's cell, family and outcome.
    rows = re.findall(r'<tr class="[^"]*" data-repro="([^"]*)">\s*<th>([^<]*)</th>', page)
    assert [repro for repro, _ in rows] == ["F1", "F1", "F2", "F2", "F3", "F3", "F10", "F10"]
    squares = re.findall(
        r'<td class="entry o-(\w+)[^"]*" data-cell="([^"]*)" data-family="([^"]*)" data-outcome="(\w+)"', page
    )
    assert ("FAIL", "current@llama", "llama", "FAIL") in squares
    assert all(css == outcome for css, _, _, outcome in squares)
    assert all(family == ("llama" if cell.endswith("@llama") else "qwen2") for _, cell, family, _ in squares)


# matplotlib warns (and draws empty axes) when a legend leaves a plot no room.
@pytest.mark.filterwarnings("error::UserWarning")
def test_ten_thousand_items_make_a_small_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(report_scale.os, "fsync", lambda fd: None)  # the writer syncs each record
    report_scale.write_run(tmp_path / "run-a", "run-a", "2026-11-19T10:00:00+00:00", 10_000, failing_cells=0)
    current = report_scale.write_run(tmp_path / "run-b", "run-b", "2026-11-20T10:00:00+00:00", 10_000)
    run = FinishedRun.load(RunDir(current))
    assert len(run.records) == 10_000
    path = html.write(run)
    assert path.stat().st_size < 15 * 2**20
    page = path.read_text()
    # The 5 cells with a mismatch are in the table (200 items each); the other 45 are a line each.
    assert matrix_columns(page) == [f"cell{i}" for i in range(5)]
    assert page.count('<details id="item-') == 1000 and len(folded_cells(page)) == 45
    assert len(report_data(page)["items"]) == 10_000


class Shown(HTMLParser):
    """The dumped DOM: the matrix's rows and header cells not hidden, the folded cells not hidden
    and those open, and the items' details made."""

    def __init__(self) -> None:
        super().__init__()
        self.body: dict[str, str | None] = {}
        self.rows: list[str] = []
        self.columns: list[str] = []
        self.folded: list[str] = []
        self.open: list[str] = []
        self.made: int = 0
        self._matrix = False
        self._row: dict[str, str | None] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "body":
            self.body = a
        elif tag == "table":
            self._matrix = a.get("id") == "matrix"
        elif self._matrix and tag == "tr" and "data-repro" in a and "hidden" not in a:
            self.rows.append(a["data-repro"] or "")
        elif self._matrix and tag == "th" and "data-cell" in a and "hidden" not in a:
            self.columns.append(a["data-cell"] or "")
        elif tag == "details" and "folded-cell" in (a.get("class") or ""):
            if "hidden" not in a:
                self.folded.append(a.get("data-cell") or "")
            if "open" in a:
                self.open.append(a.get("data-cell") or "")
        elif tag == "div" and a.get("class") == "details":
            self.made += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._matrix = False


def opened(page: Path, address: str = "") -> Shown:
    done = chromium(page.as_uri() + address)
    assert done.returncode == 0, done.stderr[-3000:]
    shown = Shown()
    shown.feed(done.stdout)
    assert "data-script-error" not in shown.body, shown.body["data-script-error"]
    return shown


@needs_chromium
def test_in_chromium_the_filters_hide_what_they_do_not_select(tmp_path: Path) -> None:
    page = html.write(FinishedRun.load(RunDir(two_runs(tmp_path))))
    everything = opened(page)
    assert everything.rows == ["F1", "F1", "F2", "F2"] and everything.body["data-rows-shown"] == "4"
    assert everything.columns == ["current", "ds-0.19.2", "moved", "tf4"]
    assert everything.folded == ["c9", "c10"] and everything.open == [] and everything.made == 0
    # A filter is an address: #repro=F2 as if F2 were chosen in its list.
    f2 = opened(page, "#repro=F2")
    assert f2.rows == ["F2", "F2"] and f2.folded == []  # the folded cells hold F1 alone
    fail = opened(page, "#outcome=FAIL")
    assert fail.rows == ["F2"] and fail.folded == []
    passing = opened(page, "#outcome=PASS")
    assert passing.rows == ["F1"] and passing.folded == ["c9", "c10"]
    one_cell = opened(page, "#cell=ds-0.19.2")
    assert one_cell.columns == ["ds-0.19.2"] and one_cell.folded == []
    folded_one = opened(page, "#cell=c10")
    assert folded_one.columns == [] and folded_one.rows == [] and folded_one.folded == ["c10"]
    mismatches = opened(page, "#mismatches=1")
    assert mismatches.rows == ["F1", "F2", "F2"] and mismatches.folded == []
    # A link to an item in a folded cell opens the cell and the item's details.
    data = report_data(page.read_text())
    index = data["folded"]["c10"]["items"][1]
    linked = opened(page, f"#item-{index}")
    assert linked.open == ["c10"] and linked.made == 1
