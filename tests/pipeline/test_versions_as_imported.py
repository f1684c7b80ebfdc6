"""A record's versions are what its ranks imported; the cell's listing is kept beside them where it
differs, and both reports show the difference (a passthrough rank keeps the caller's PYTHONPATH,
which can put another release first)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from harness.environments import Environment
from harness.execution.classify import Observation
from harness.pipeline.item_records import item_record
from harness.records.item import ItemId
from harness.reports.html import _facts
from harness.reports.terminal import print_summary
from repros.runtime.outcomes import Outcome
from tests.support.rank_records import failed_launch, rank_record

LISTED = {"torch": "2.13.0+cpu", "peft": "0.21.2", "transformers": "5.23.0"}


def _env() -> Environment:
    return Environment(
        key="passthrough",
        python="/usr/bin/python3",
        python_version="3.12.3",
        packages=dict(LISTED),
        path=None,
        extensions_dir="/tmp/ext",
        reused=True,
        build_s=0.0,
        provider="passthrough",
    )


def _record(imported: dict[str, str | None]):
    seen = {name: {"version": v, "path": f"/elsewhere/{name}", "imported": True} for name, v in imported.items()}
    rank = rank_record(0, "ok", phase="run", versions_imported=seen, python_version="3.12.3")
    launch = failed_launch({0: rank})
    return item_record(
        run_id="r",
        item=ItemId("here", "F1", "bug"),
        observation=Observation(Outcome.NOT_REPRODUCED),
        expected=None,
        env=_env(),
        launch=launch,
        repro_cmd="ft-regress run",
        item_dir=Path("/tmp/item"),
        started_at="2026-11-27T00:00:00+00:00",
        finished_at="2026-11-27T00:00:01+00:00",
    )


def test_a_record_names_what_the_ranks_imported_and_keeps_the_listing_where_it_differs() -> None:
    record = _record({"torch": "2.13.0+cpu", "peft": "0.22.0.dev0", "transformers": "5.23.0"})
    assert record.versions["peft"] == "0.22.0.dev0"
    assert record.versions_listed is not None and record.versions_listed["peft"] == "0.21.2"
    assert record.versions_differing() == ["peft listed 0.21.2, imported 0.22.0.dev0"]
    # On disk and back.
    assert type(record).model_validate(record.as_json()).versions_listed == record.versions_listed


def test_where_they_agree_no_listing_is_kept() -> None:
    record = _record(dict(LISTED))
    assert record.versions_listed is None and record.versions_differing() == []


def test_both_reports_show_the_difference() -> None:
    record = _record({"torch": "2.13.0+cpu", "peft": "0.22.0.dev0", "transformers": "5.23.0"})
    facts = dict((label, value) for label, value, _ in _facts(record))
    assert facts["not as listed"] == "peft listed 0.21.2, imported 0.22.0.dev0"
    console = Console(record=True, width=200)
    print_summary(console, [record])
    assert (
        "imported other versions than the cell lists: peft listed 0.21.2, imported 0.22.0.dev0" in console.export_text()
    )
