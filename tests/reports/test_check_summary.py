"""What ``check`` says of a stack, failure by failure: has it only where the documented configuration
REPRODUCED; cannot run here (and why) for INFRA and exclusions; the fixed trainer's outcome and what
its guards cost; a contradiction of the catalog named; another documented failure that came first named."""

from __future__ import annotations

from typing import Any

from harness.records.item import ItemRecord
from harness.records.run_meta import ExcludedItem
from harness.reports.check_summary import (
    CANNOT_RUN,
    HAS,
    HAS_NOT,
    UNCLEAR,
    check_verdicts,
    conclusion,
    stack_has_a_failure,
)
from repros.catalog.f13_zero3_modules_to_save_ds_grads_remaining import SPEC as F13
from tests.support.report_fixture import _record, _step


def _rec(repro: str, mode: str, outcome: str, **fields: Any) -> ItemRecord:
    raw = _record("here", repro, mode, outcome, **fields)
    raw.setdefault("guards", [])
    return ItemRecord.model_validate(raw)


def test_a_failure_is_had_only_where_its_documented_configuration_reproduced() -> None:
    records = [
        _rec(
            "F1",
            "bug",
            "REPRODUCED",
            signature="F1.recompute-shape-0",
            error={"type": "CheckpointError", "message": "Recomputed values...", "rank": 0},
        ),
        _rec("F1", "fixed", "PASS", guards=[{"id": "zero3-reentrant-checkpointing"}]),
        _rec("F2", "bug", "NOT_REPRODUCED", step_time_s=_step(0.200)),
        _rec("F2", "fixed", "PASS", guards=[{"id": "use-cache-off"}], step_time_s=_step(0.260)),
    ]
    verdicts = {v.repro: v for v in check_verdicts(records, [])}
    assert verdicts["F1"].verdict == HAS and "F1.recompute-shape-0" in verdicts["F1"].why
    assert "PASS with zero3-reentrant-checkpointing" in verdicts["F1"].fixed
    assert verdicts["F2"].verdict == HAS_NOT
    # Where the unguarded run trained, the guards are priced against it.
    assert "guards cost" in verdicts["F2"].fixed and "+60 ms/step" in verdicts["F2"].fixed
    assert stack_has_a_failure(list(verdicts.values()))


def test_what_cannot_run_here_says_why_and_is_not_a_failure_of_the_stack() -> None:
    reason = "rank 0: bitsandbytes is not installed in this cell (the scenario needs it for nf4 quantization (QLoRA))"
    records = [
        _rec("F14", "bug", "INFRA", reasons=[reason], matched=False, expected="NOT_REPRODUCED"),
        _rec("F14", "fixed", "INFRA", reasons=[reason], matched=False, expected="PASS"),
    ]
    excluded = [ExcludedItem(cell="here", repro="F12", mode="bug", reason="F12 cannot occur at world size 1 ...")]
    verdicts = {v.repro: v for v in check_verdicts(records, excluded)}
    assert verdicts["F14"].verdict == CANNOT_RUN and "bitsandbytes is not installed" in verdicts["F14"].why
    assert verdicts["F14"].contradicts == ""  # INFRA is not a contradiction of the catalog
    assert verdicts["F12"].verdict == CANNOT_RUN and "world size 1" in verdicts["F12"].why
    assert not stack_has_a_failure(list(verdicts.values()))
    assert [v.repro for v in check_verdicts(records, excluded)] == ["F12", "F14"]


def test_a_contradiction_of_the_catalog_and_a_failure_that_came_first_are_named() -> None:
    records = [
        _rec(
            "F9",
            "bug",
            "DIFFERENT_ERROR",
            matched=True,
            expected="DIFFERENT_ERROR",
            error={
                "type": "AttributeError",
                "message": "'Linear' object has no attribute 'ds_grads_remaining'",
                "rank": 0,
            },
        ),
        _rec("F5", "bug", "NOT_REPRODUCED", matched=False, expected="REPRODUCED"),
    ]
    verdicts = {v.repro: v for v in check_verdicts(records, [], [F13])}
    assert verdicts["F9"].verdict == UNCLEAR and "F13.ds-grads-remaining" in verdicts["F9"].why
    assert verdicts["F5"].contradicts == "the catalog expects REPRODUCED for these versions"
    assert verdicts["F5"].line().startswith("F5   does not have it")


def test_the_last_line_counts_what_could_run() -> None:
    infra = {"reasons": ["rank 0: deepspeed does not import in this cell: ..."], "matched": False}
    records = [_rec("F1", "bug", "INFRA", **infra), _rec("F2", "bug", "NOT_REPRODUCED")]
    assert conclusion(check_verdicts(records, [])) == (
        "this stack has none of the 1 documented failures that could run here; 1 could not run here"
    )
    records.append(_rec("F8", "bug", "REPRODUCED", signature="F8.uniform-requires-grad"))
    assert conclusion(check_verdicts(records, [])) == "this stack has F8; 1 it does not have; 1 could not run here"
