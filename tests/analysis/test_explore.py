"""Explore mode's findings per cell, the expectations derived from them, and how they are written
back into a declaration (only its expectations change; comments and layout stay)."""

from __future__ import annotations

import os
import textwrap
import time
from pathlib import Path
from typing import Any

import yaml

from harness.analysis.explore import last_run
from harness.analysis.explore.declaration import merge, write_expectations
from harness.records.item import ItemRecord, parse_record
from harness.records.run_meta import CellMeta, RunMeta
from harness.reports.findings import derive_expectations, findings
from repros.runtime.kinds.script import normalise, read_declaration
from repros.runtime.spec import Expectation

RAW_CELLS = {
    "current": {
        "requested": {"deepspeed": "==0.19.8", "torch": "==2.13.0"},
        "packages": {"deepspeed": "0.19.8", "torch": "2.13.0+cpu", "numpy": "2.4.6"},
        "python": "3.11.7",
    },
    "old-ds": {
        "requested": {"deepspeed": "==0.19.2", "torch": "==2.13.0"},
        "packages": {"deepspeed": "0.19.2", "torch": "2.13.0+cpu", "numpy": "2.4.6"},
        "python": "3.11.7",
    },
    "old-ds-twin": {
        "requested": {"deepspeed": "==0.19.2"},
        "packages": {"deepspeed": "0.19.2", "torch": "2.13.0+cpu", "numpy": "2.4.6"},
        "python": "3.11.7",
    },
}
#: The cells as ``run.json`` holds them, read back.
CELLS = {name: CellMeta.model_validate(cell) for name, cell in RAW_CELLS.items()}


def record(cell: str, outcome: str, mode: str = "bug", **extra: Any) -> ItemRecord:
    return parse_record(
        {
            "schema_version": 1,
            "run_id": "RUN",
            "cell": cell,
            "repro": "mine",
            "mode": mode,
            "outcome": outcome,
            "expected": None,
            "explored": True,
            "matched": False,
            "device": "cpu",
            "world_size": 2,
            "signature": "mine.declared" if outcome == "REPRODUCED" else None,
            "error": None,
            "reasons": [],
            "versions": {},
            "wall_s": 1.0,
            "guards": [],
            "env": None,
            "repro_cmd": "python -m harness run --explore",
            "started_at": "2026-11-23T00:00:00Z",
            "finished_at": "2026-11-23T00:00:01Z",
            **extra,
        }
    )


def test_findings_say_where_it_fails_where_it_runs_and_with_what() -> None:
    (finding,) = findings(
        [
            record("current", "NOT_REPRODUCED"),
            record("old-ds", "REPRODUCED"),
            record("x", "INFRA", reasons=["rank 0: no GPU"]),
        ]
    )
    assert finding.lines(CELLS) == [
        "mine / bug",
        "  runs in current (deepspeed 0.19.8): NOT_REPRODUCED",
        "  fails as declared in old-ds (deepspeed 0.19.2): REPRODUCED [mine.declared]",
        "  could not run in x (deepspeed -): INFRA - rank 0: no GPU",
        "  the cells differ in: deepspeed",
    ]


def test_expectations_are_pinned_to_the_versions_that_differ_and_name_the_command() -> None:
    derived = derive_expectations(
        [record("current", "NOT_REPRODUCED"), record("old-ds", "REPRODUCED"), record("x", "HANG")],
        CELLS,
        "ft-regress run --explore --cells current,old-ds",
        today="2026-11-23",
    )
    assert [(e.outcome, e.when) for e in derived.expectations] == [
        ("NOT_REPRODUCED", {"deepspeed": "==0.19.8"}),
        ("REPRODUCED", {"deepspeed": "==0.19.2"}),
    ]
    assert derived.expectations[1].established_by == (
        "ft-regress run --explore --cells current,old-ds (2026-11-23, cpu, 2 ranks)"
    )
    assert derived.expectations[1].note == "observed in old-ds: deepspeed 0.19.2; signature mine.declared"
    assert derived.skipped == ["x/mine/bug: HANG, nothing observed"]


def test_cells_with_the_same_versions_and_different_outcomes_are_not_saved() -> None:
    derived = derive_expectations(
        [record("current", "NOT_REPRODUCED"), record("old-ds", "REPRODUCED"), record("old-ds-twin", "NOT_REPRODUCED")],
        CELLS,
        "cmd",
    )
    assert [e.when for e in derived.expectations] == [{"deepspeed": "==0.19.8"}]
    assert derived.skipped == [
        "old-ds, old-ds-twin ran the same versions and observed NOT_REPRODUCED and REPRODUCED: not saved"
    ]


def test_merging_keeps_the_expectations_the_observations_do_not_cover() -> None:
    existing = [
        Expectation(mode="bug", outcome="REPRODUCED", when={"deepspeed": "<0.19.3"}),  # observed again: replaced
        Expectation(mode="bug", outcome="NOT_REPRODUCED", when={"deepspeed": ">=0.20"}),  # not observed: kept
        Expectation(mode="fixed", outcome="PASS", when={}),  # another mode: kept
    ]
    derived = [Expectation(mode="bug", outcome="DIFFERENT_ERROR", when={"deepspeed": "==0.19.2"})]
    merged = merge(existing, derived, [{"deepspeed": "0.19.2"}])
    assert merged == [derived[0], existing[1], existing[2]]


DECLARATION = textwrap.dedent("""
    # why this repro exists
    repro:
      id: mine
      script: train.py   # the real one
      fails_with:
        type: ValueError
        pattern: boom
      expectations:
        - {outcome: NOT_REPRODUCED}
      # after the expectations
      world_size: 2
    other: kept
""")


def test_a_yaml_declaration_keeps_its_comments_and_reads_back_as_written(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(DECLARATION)
    (tmp_path / "train.py").write_text("")
    wanted = [Expectation(mode="bug", outcome="REPRODUCED", when={"deepspeed": "==0.19.2"}, established_by="cmd")]
    written = [{"mode": "bug", "outcome": "REPRODUCED", "when": {"deepspeed": "==0.19.2"}, "established_by": "cmd"}]
    assert write_expectations(path, wanted) == "in place"
    text = path.read_text()
    for kept in (
        "# why this repro exists",
        "script: train.py   # the real one",
        "# after the expectations",
        "other: kept",
    ):
        assert kept in text
    assert yaml.safe_load(text)["repro"]["expectations"] == written
    declared = normalise(path, read_declaration(path))
    assert declared["world_size"] == 2 and declared["expectations"][0]["when"] == {"deepspeed": "==0.19.2"}


def test_a_flow_style_declaration_is_rewritten_whole_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("repro: {id: mine, script: train.py, fails_with: {type: ValueError, pattern: boom}}\n")
    how = write_expectations(path, [Expectation(mode="bug", outcome="REPRODUCED")])
    assert how.startswith("rewritten whole")
    assert yaml.safe_load(path.read_text())["repro"]["expectations"] == [{"mode": "bug", "outcome": "REPRODUCED"}]


def test_a_repro_file_written_the_moment_before_a_run_started_is_not_a_change_since(tmp_path: Path) -> None:
    # `run` right after saving one's repro, then `run --save-expectations`: the second must reuse the first
    # run, which a start kept to the second could not tell from a file changed during it.
    repro = tmp_path / "repro.yaml"
    repro.write_text("repro: {}\n")
    just_before = time.time() - 0.002
    os.utime(repro, (just_before, just_before))
    meta = RunMeta.started("run-1", ["run"])
    started = last_run._started(meta)
    assert started is not None
    assert not last_run._changed_since([repro], started)
    changed_since = started.timestamp() + 0.001
    os.utime(repro, (changed_since, changed_since))
    assert last_run._changed_since([repro], started)
