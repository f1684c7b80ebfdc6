"""F18: its signature on the recorded traceback (the harness's run of F18's bug mode in cell
``tf-5.5.3-trl``: torch 2.13.0 CPU, deepspeed 0.19.8, transformers 5.5.3, trl 1.1.0, kernels 0.13.0,
2 ranks, gloo, 2026-11-26, rank 0's log; and an earlier run on deepspeed 0.18.6), ``explain`` on it,
and the guard that works around it."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.version import Version

from harness.analysis.explain.logs import logged_errors
from harness.analysis.explain.match import DOCUMENTED, explain
from harness.config.repros import discover
from harness.execution.classify import DIFFERENT_ERROR, REPRODUCED, classify
from repros.catalog.f18_zero3_trl_rotary_fn_deque import SPEC as F18
from repros.trainer.guards import Versions, apply_guards, choose_guards
from repros.trainer.scenario import Scenario
from tests.support.rank_records import error_record, failed_launch

RECORDED = Path(__file__).resolve().parent.parent / "support" / "recorded"
F18_TRACEBACK = (RECORDED / "f18_pop_empty_deque_deepspeed-0.19.8_transformers-5.5.3_trl-1.1.0.txt").read_text()
#: The same failure on deepspeed 0.18.6 (a run of the same repro before the cells moved to deepspeed 0.19.8).
F18_TRACEBACK_DS_0_18 = (RECORDED / "f18_pop_empty_deque_deepspeed-0.18.6_transformers-5.5.3_trl-1.1.0.txt").read_text()
SCENARIO = Scenario(engine="deepspeed", zero_stage=3, zero3_persistence_threshold=0, bf16=False, trainer_loop="hf")


def _versions(transformers: str, deepspeed: str = "0.19.8") -> Versions:
    return {"transformers": Version(transformers), "deepspeed": Version(deepspeed), "torch": Version("2.13.0")}


def test_the_recorded_traceback_is_f18_in_bug_mode() -> None:
    assert F18_TRACEBACK.rstrip().endswith("IndexError: pop from an empty deque")
    launch = failed_launch({0: error_record(0, "IndexError", "pop from an empty deque")}, exitcodes={0: 1})
    observed = classify("bug", F18, launch)
    assert observed.outcome == REPRODUCED
    assert observed.signature == "F18.pop-from-empty-deque"


def test_another_index_error_is_a_different_error() -> None:
    launch = failed_launch({0: error_record(0, "IndexError", "list index out of range")}, exitcodes={0: 1})
    assert classify("bug", F18, launch).outcome == DIFFERENT_ERROR


@pytest.mark.parametrize("text", [F18_TRACEBACK, F18_TRACEBACK_DS_0_18])
def test_explain_names_f18_from_the_real_traceback(text: str) -> None:
    found = explain(logged_errors(text), discover().repros.values())
    assert [(m.repro.id, m.signature.id, m.status) for m in found.matches] == [
        ("F18", "F18.pop-from-empty-deque", DOCUMENTED)
    ]


def test_the_guard_applies_on_transformers_5_0_to_5_5_3_under_zero3_only() -> None:
    for version, expected in (("5.5.3", True), ("5.0.0", True), ("5.5.4", False), ("4.57.6", False)):
        ids = [g.id for g in choose_guards(SCENARIO, _versions(version))]
        assert ("zero3-no-shared-rotary-fn" in ids) is expected, version
    guarded = apply_guards(SCENARIO, choose_guards(SCENARIO, _versions("5.5.3")))
    assert guarded.zero3_no_kernel_func_children
    zero2 = Scenario(engine="deepspeed", zero_stage=2, trainer_loop="hf")
    assert "zero3-no-shared-rotary-fn" not in [g.id for g in choose_guards(zero2, _versions("5.5.3"))]


def test_a_variant_of_f18_that_ran_to_its_end_passes() -> None:
    from harness.execution.classify import classify
    from harness.execution.launchers.result import LaunchResult
    from tests.support.rank_records import rank_record

    records = {r: rank_record(r) for r in (0, 1)}
    launch = LaunchResult(
        command=["torchrun"],
        returncode=0,
        timed_out=False,
        wall_s=1.0,
        world_size=2,
        records=records,
        rank_exitcodes={0: 0, 1: 0},
    )
    assert classify("scenario", F18, launch, []).outcome == "PASS"


def test_a_grid_combination_that_pops_an_empty_deque_is_named_f18() -> None:
    from harness.execution.classify import classify

    launch = failed_launch({0: error_record(0, "IndexError", "pop from an empty deque")}, exitcodes={0: 1})
    known = [r.spec for r in discover().repros.values()]
    observed = classify("scenario", None, launch, known)
    assert observed.outcome == REPRODUCED
    assert observed.signature == "F18.pop-from-empty-deque"
