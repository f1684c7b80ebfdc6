"""F16: its signature on the recorded failure text and rank log, and near-misses; the check that raises it;
the guard that works around it; and a grid combination that meets it named by it.

Recorded texts (tests/support/recorded/), from F16's bug mode in cell ``acc-1.14`` (accelerate 1.14.0,
torch 2.13.0 CPU, 2 ranks, gloo):
- ``f16_saved_adapter_rank0_shard_...txt``: rank 0's message: every tensor in ``pytorch_model_fsdp.bin``
  a DTensor holding rank 0's local shard (4, 64) of (8, 64).
- ``f16_saved_adapter_rank_log_...log``: the same rank's log, progress bars, warnings and traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from harness.analysis.explain.logs import logged_errors
from harness.analysis.explain.match import DOCUMENTED, explain
from harness.config.expectations import expectation_for
from harness.config.repros import discover
from harness.execution.classify import DIFFERENT_ERROR, REPRODUCED, classify
from harness.execution.launchers.result import LaunchResult
from repros.catalog.f16_fsdp2_adapter_only_rank0_shard import ACCELERATE_FSDP2_ADAPTER_FULL_SAVE, SCENARIO
from repros.catalog.f16_fsdp2_adapter_only_rank0_shard import SPEC as F16
from repros.runtime.outcomes import Outcome
from repros.trainer.fsdp_adapter_save import check_saved_adapter
from repros.trainer.guards import apply_guards, choose_guards
from repros.trainer.silent_failures import SavedAdapterIncomplete
from tests.support.rank_records import error_record, failed_launch

RECORDED = Path(__file__).resolve().parent.parent / "support" / "recorded"
REPROS = list(discover().repros.values())
KNOWN = [r.spec for r in REPROS]
INCOMPLETE = f"{SavedAdapterIncomplete.__module__}.{SavedAdapterIncomplete.__qualname__}"
GUARD = "fsdp2-adapter-full-state-dict"
#: Installed versions as the cells of the matrix have them.
ACC_114 = {"accelerate": Version("1.14.0"), "transformers": Version("5.23.0"), "torch": Version("2.13.0")}
CURRENT = {**ACC_114, "accelerate": Version("1.15.0")}


def recorded(name: str) -> str:
    return (RECORDED / name).read_text()


F16_TEXT = recorded("f16_saved_adapter_rank0_shard_accelerate-1.14.0_torch-2.13.0.txt")
F16_LOG = recorded("f16_saved_adapter_rank_log_accelerate-1.14.0_torch-2.13.0.log")


def failing_launch(etype: str, message: str) -> LaunchResult:
    return failed_launch({0: error_record(0, etype, message)}, exitcodes={0: 1})


def observed(spec: Any, etype: str, message: str) -> tuple[str, str | None]:
    obs = classify("bug", spec, failing_launch(etype, message))
    return obs.outcome, obs.signature


def test_f16_recorded_text_is_f16() -> None:
    assert "holding a local shard (4, 64), trained (8, 64)" in F16_TEXT
    assert observed(F16, INCOMPLETE, F16_TEXT) == (REPRODUCED, "F16.saved-adapter-rank0-shard")


def test_f16_the_rank_log_is_explained_as_f16_from_its_traceback() -> None:
    errors = logged_errors(F16_LOG)
    assert [e.type for e in errors] == [INCOMPLETE]
    (match,) = explain(errors, REPROS).matches
    assert (match.repro.id, match.signature.id, match.status) == ("F16", "F16.saved-adapter-rank0-shard", DOCUMENTED)


@pytest.mark.parametrize(
    ("etype", "message"),
    [
        # F7's silent empty adapter (ZeRO-3, safetensors): another save, another failure.
        ("repros.trainer.silent_failures.ReloadedAdapterDiffers", "reloaded adapter differs from the trained one"),
        # An incomplete adapter in another file is not accelerate's FSDP checkpoint.
        (INCOMPLETE, "saved adapter incomplete: 2 of 8 tensors in adapter_model.safetensors (40 bytes) are not"),
    ],
)
def test_f16_near_misses(etype: str, message: str) -> None:
    assert observed(F16, etype, message)[0] == DIFFERENT_ERROR


def test_the_check_raises_only_for_tensors_that_are_not_the_full_trained_ones() -> None:
    complete = {"file": "pytorch_model_fsdp.bin", "bytes": 18407, "tensors": 8, "complete": 8, "incomplete": {}}
    check_saved_adapter(complete)
    shard = "a DTensor of global shape (8, 64) holding a local shard (4, 64), trained (8, 64)"
    incomplete = {**complete, "bytes": 13358, "complete": 7, "incomplete": {"x.lora_A.weight": shard}}
    with pytest.raises(SavedAdapterIncomplete) as raised:
        check_saved_adapter(incomplete)
    assert str(raised.value) == (
        "saved adapter incomplete: 1 of 8 tensors in pytorch_model_fsdp.bin (13358 bytes) are not the trained "
        f"adapter's full tensors; x.lora_A.weight: {shard}"
    )
    assert observed(F16, INCOMPLETE, str(raised.value))[0] == REPRODUCED


def test_f16_guard_gathers_the_full_adapter_before_accelerate_1_15_only() -> None:
    assert ACCELERATE_FSDP2_ADAPTER_FULL_SAVE == Version("1.15.0")
    guards = choose_guards(SCENARIO, ACC_114)
    assert GUARD in [g.id for g in guards]
    assert apply_guards(SCENARIO, guards).fsdp2_adapter_full_state_dict
    assert GUARD not in [g.id for g in choose_guards(SCENARIO, CURRENT)]
    # Without accelerate installed there is nothing it could save wrongly.
    assert GUARD not in [g.id for g in choose_guards(SCENARIO, {**ACC_114, "accelerate": None})]


def test_f16_expectations_follow_the_bisected_boundary() -> None:
    def expected(accelerate: str) -> str | None:
        found = expectation_for(F16, "bug", {"accelerate": accelerate})
        return found.outcome if found else None

    assert [expected(v) for v in ("1.7.0", "1.14.0", "1.15.0")] == [
        Outcome.REPRODUCED,
        Outcome.REPRODUCED,
        Outcome.NOT_REPRODUCED,
    ]


def test_a_grid_combination_meeting_f16_is_named_by_it() -> None:
    obs = classify("scenario", None, failing_launch(INCOMPLETE, F16_TEXT), KNOWN)
    assert (obs.outcome, obs.signature) == (Outcome.REPRODUCED, "F16.saved-adapter-rank0-shard")
