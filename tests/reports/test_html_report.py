"""The HTML report: the matrix, details, guard costs, history, escaping, offline page."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from html.parser import HTMLParser
from pathlib import Path

from harness.records.run_dir import RunDir
from harness.records.run_meta import RunMeta
from harness.reports import html as html_report
from harness.reports.finished import FinishedRun
from harness.reports.guard_costs import guard_costs
from harness.reports.history import load_history
from harness.reports.html import REPORT_FILE, render_report
from tests.support.report_fixture import EXCLUDED, HOSTILE, MIB, records, typed, write_reports
from tests.support.report_page import item_facts


def write_report(run_dir: Path) -> Path:
    return html_report.write(FinishedRun.load(RunDir(run_dir)))


class Tags(HTMLParser):
    """Every start tag of a page, with its attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def tags_of(page: str) -> list[tuple[str, dict[str, str | None]]]:
    parser = Tags()
    parser.feed(page)
    return parser.tags


def meta(**extra: object) -> RunMeta:
    return RunMeta.model_validate({"run_id": "run-b", "excluded": EXCLUDED, **extra})


def test_matrix_has_every_entry_with_its_details(tmp_path: Path) -> None:
    run_dir = write_reports(tmp_path / "reports")
    page = write_report(run_dir).read_text()
    assert (run_dir / REPORT_FILE).exists()
    tags = tags_of(page)
    entries = [a for t, a in tags if t == "td" and "entry" in (a.get("class") or "").split()]
    # 2 repros x 2 modes, 3 cells (tf4 appears through its UNRESOLVABLE and excluded items).
    assert len(entries) == 12
    classes = [a["class"] or "" for a in entries]
    assert sum("mismatch" in c.split() for c in classes) == 3
    assert any("o-excluded" in c for c in classes) and any("o-REPRODUCED" in c for c in classes)
    details = [a["id"] or "" for t, a in tags if t == "details" and (a["id"] or "").startswith("item-")]
    assert len(details) == 8
    # The details (the page's script makes them when an entry is opened) carry the error, per-rank
    # tails, versions, guards and a command to copy.
    facts = {i: item_facts(page, i) for i in range(8)}
    text = "\n".join(f"{label}: {value}" for found in facts.values() for label, value, _ in found)
    assert "CheckpointError" in text and "F1.recompute-shape-0" in text
    assert "ds-zero3-ckpt-reentrant: deepspeed<0.19.3 recomputes" in text
    assert "rank 1: loss did not fall (2.31 -> 2.35)" in text and "rank 1: loss did not fall (2.31 -&gt; 2.35)" in page
    assert "deepspeed 0.19.2" in text and "torch 2.13.0+cpu" in text
    assert "python -m harness run --matrix matrix.yaml --cells tf4 --repros F1 --modes bug" in text
    assert sum(1 for found in facts.values() for _, _, how in found if how == html_report.COMMAND) == 8
    assert "deepspeed<0.19.3" not in page  # in the data as \\u003c: no markup can start there
    assert "5 of 8 items matched their expectation; 3 did not" in page


def test_every_string_from_a_run_is_escaped() -> None:
    hostile_records = records()
    evil = '<img src=x onerror="alert(2)">'
    for rec in hostile_records:
        rec["cell"] = f"{rec['cell']}{evil}"
        rec["repro"] = f"{rec['repro']}\"'><script>alert(3)</script>"
        rec["repro_cmd"] = f"{rec['repro_cmd']} {HOSTILE}"
        rec["reasons"] = [*rec["reasons"], HOSTILE]
        rec["guards"] = [{"id": f"g{evil}", "reason": HOSTILE} for _ in rec["guards"]]
        for rank in rec.get("ranks") or []:
            rank["log_tail"] = f"{rank['log_tail']}\n{HOSTILE}"
    excluded = [{"cell": evil, "repro": "F1", "mode": "bug", "reason": HOSTILE}]
    page = render_report(typed(hostile_records), meta(argv=["run", HOSTILE], lane=evil, excluded=excluded))
    tags = tags_of(page)
    # The report's own script, at the end, and its data (JSON, never run).
    assert [(t, a.get("type")) for t, a in tags if t == "script"] == [("script", "application/json"), ("script", None)]
    assert not any(t in ("img", "b", "i") for t, _ in tags)
    assert not any(k.startswith("on") for _, attrs in tags for k in attrs)
    assert "<script>alert" not in page and "alert(3)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &#34;quoted&#34; &amp; &lt;b&gt;bold&lt;/b&gt;" in page
    # The plots name the cells too: matplotlib escapes them inside the SVG.
    assert "&lt;img src=x" in page.split('id="plot-fixed"', 1)[1]


def test_the_page_loads_nothing_from_the_network() -> None:
    page = render_report(typed(records()), meta())
    tags = tags_of(page)
    assert not any(t in ("link", "iframe", "img", "object", "embed") for t, _ in tags)
    for _tag, attrs in tags:
        for name in ("src", "href"):
            assert not (attrs.get(name) or "").startswith(("http:", "https:", "//")), attrs
    (csp,) = [a["content"] for t, a in tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"]
    assert csp is not None and "default-src 'none'" in csp
    # The one script is allowed by its hash, so nothing injected could run even unescaped.
    script = re.search(r"<script>(.*)</script>", page, re.S)
    assert script is not None
    digest = base64.b64encode(hashlib.sha256(script.group(1).encode()).digest()).decode()
    assert f"'sha256-{digest}'" in csp
    assert [t for t, _ in tags].count("svg") == 2  # the fixed trainer's and the guards' plots


def test_guard_cost_is_fixed_minus_a_clean_bug_run() -> None:
    priced, unpriced = guard_costs(typed(records()))
    by = {c.label: c for c in priced}
    assert set(by) == {"current/F1", "current/F2"}
    quiet = by["current/F1"]
    assert quiet.guards == () and quiet.mem_delta == 5 * MIB and "noise" in quiet.note
    assert abs(quiet.step_delta_s - 0.005) < 1e-9  # type: ignore[operator]
    costly = by["current/F2"]
    assert costly.guards == ("ds-zero3-ckpt-reentrant",) and costly.mem_delta == 300 * MIB
    assert abs(costly.step_delta_s - 0.060) < 1e-9 and costly.note == ""  # type: ignore[operator]
    (skipped,) = unpriced
    assert (skipped.cell, skipped.repro) == ("ds-0.19.2", "F1") and "REPRODUCED" in skipped.why


def test_guard_cost_within_the_noise_and_different_memory_kinds() -> None:
    recs = [r for r in records() if r["cell"] == "current" and r["repro"] == "F2"]
    recs[1] = {**recs[1], "step_time_s": {**recs[0]["step_time_s"], "median": 0.303}, "peak_mem_kind": "cuda"}
    ((cost,), _) = guard_costs(typed(recs))
    assert "within the noise" in cost.note and "not compared" in cost.note and cost.mem_delta is None


def test_history_reads_the_runs_beside_this_one(tmp_path: Path) -> None:
    run_dir = write_reports(tmp_path / "reports")
    (tmp_path / "reports" / "not-a-run").mkdir()
    (tmp_path / "reports" / "bisect-x").mkdir()
    (tmp_path / "reports" / "bisect-x" / "results.jsonl").write_text("")
    runs = load_history(run_dir)
    assert [r.name for r in runs] == ["run-a", "run-b"] and [r.current for r in runs] == [False, True]
    assert runs[0].records[("current", "F2", "fixed")].outcome == "PASS"
    assert [r.name for r in load_history(tmp_path / "reports" / "run-a", limit=1)] == ["run-a"]
    page = write_report(run_dir).read_text()
    history = page.split('id="history"', 1)[1]
    assert "run-a" in history and "run-b" in history and 'id="plot-history"' in history
    assert history.count("FAIL") >= 1 and history.count("PASS") >= 4


def test_a_lone_run_without_run_json_still_renders(tmp_path: Path) -> None:
    run_dir = tmp_path / "lone"
    run_dir.mkdir()
    with open(run_dir / "results.jsonl", "w") as fh:
        for rec in records():
            # Items without ranks, environment or guards (every record has env and guards: none is empty).
            bare = {k: v for k, v in rec.items() if k != "ranks"}
            fh.write(json.dumps({**bare, "env": None, "guards": []}) + "\n")
    page = write_report(run_dir).read_text()
    assert "the history starts here" in page and "ft-regress run run-b" in page


def test_planned_items_without_a_record_show_as_not_run() -> None:
    page = render_report(typed(records()[:2]), meta(planned=["current/F1/bug", "current/F1/fixed", "current/F5/bug"]))
    assert "not run" in page and "F5 / bug" in page


def test_a_run_over_several_model_families_can_show_one_family_at_a_time() -> None:
    raw = records()[:2]
    llama = [{**r, "cell": f"{r['cell']}@llama", "family": "llama", "family_of": r["cell"]} for r in raw]
    page = render_report(typed(raw + llama), meta())
    select = [attrs for tag, attrs in tags_of(page) if tag == "select"]
    assert [a.get("id") for a in select] == ["repro-filter", "cell-filter", "family-filter", "outcome-filter"]
    family = page.split('id="family-filter"', 1)[1].split("</select>", 1)[0]
    options = re.findall(r'<option value="([^"]*)">', family)
    assert options == ["", "llama", "qwen2"]
    # Each cell says its family, in the table and folded (both cells matched: folded).
    folded = re.findall(r'<details class="folded-cell" id="cell-\d+" data-cell="([^"]*)" data-family="([^"]*)">', page)
    assert (f"{raw[0]['cell']}@llama", "llama") in folded and (raw[0]["cell"], "qwen2") in folded
    # One family alone: no filter to offer.
    assert 'id="family-filter"' not in render_report(typed(raw), meta())


def test_repros_are_in_natural_order_and_family_variants_sit_beside_their_cell() -> None:
    raw = records()
    by_id = {(r["cell"], r["repro"], r["mode"]): r for r in raw}
    first = raw[0]
    extra = [
        {**first, "repro": "F10"},
        {**first, "repro": "F2"},
        {**first, "cell": f"{first['cell']}@phi3", "family": "phi3", "family_of": first["cell"]},
    ]
    page = render_report(typed(extra + raw), meta())
    rows = re.findall(r"<th>(F\d+) / ([\w-]+)</th>", page)
    numbers = [int(repro[1:]) for repro, _ in rows]
    assert numbers == sorted(numbers) and ("F2", first["mode"]) in rows and ("F10", first["mode"]) in rows
    cells = page.split('id="cell-filter"', 1)[1].split("</select>", 1)[0]
    headers = re.findall(r'<option value="([^"]+)">', cells)
    assert headers.index(f"{first['cell']}@phi3") == headers.index(first["cell"]) + 1
    assert by_id  # the fixture's own records are all still there


def test_a_script_repros_report_has_no_trainer_chart_nor_guard_costs_and_says_where_the_cells_differ() -> None:
    from tests.support.report_fixture import _record

    found: dict[str, object] = {"explored": True, "expected": None, "matched": False, "step_time_s": None}
    own: dict[str, object] = {**found, "workaround": "own"}
    explored = [
        _record("current", "mine", "bug", "NOT_REPRODUCED", **found),
        _record("ds-0.19.2", "mine", "bug", "REPRODUCED", **found),
        _record("current", "mine", "fixed", "PASS", **own),
        _record("ds-0.19.2", "mine", "fixed", "PASS", **own),
    ]
    cells = {
        "current": {"packages": {"deepspeed": "0.19.8", "torch": "2.13.0"}, "requested": {"deepspeed": "==0.19.8"}},
        "ds-0.19.2": {"packages": {"deepspeed": "0.19.2", "torch": "2.13.0"}, "requested": {"deepspeed": "==0.19.2"}},
    }
    page = render_report(typed(explored), meta(cells=cells, excluded=[]))
    assert "Fixed trainer: memory and step time" not in page and "What the guards cost" not in page
    assert "unknown time per step" not in page
    assert "the cells differ in: deepspeed" in page
