"""F12, F13 and F21: their signatures on recorded failure texts and on the upstream wordings, their
near-misses, and the guards that work around them.

Recorded texts (tests/support/recorded/), each the failing rank's message in a harness run (torch
2.13.0 CPU, 2 ranks, gloo, 2026-11-26):
- ``f12_gloo_invalid_tensor_type_...``: F12's bug mode in cell ``ds-0.19.2``: the all-gather of the
  persistent parameters after the first optimizer step, a float32 buffer handed a bf16 partition.
- ``f13_ds_grads_remaining_...``: F13's bug mode in cell ``ds-0.19.2`` (the same text as F9's
  near-miss there, ``f9_near_miss_ds_grads_remaining_deepspeed-0.19.2.txt``).
- ``f21_gathers_diverged_...``: F21's bug mode in cell ``tf4-ds-0.17.6``: the two ranks about to gather
  different experts of layer 0.
The NCCL wordings are the upstream threads' (DeepSpeed#8072, DeepSpeed PR #5008's thread).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from harness.execution.classify import DIFFERENT_ERROR, REPRODUCED, classify
from harness.execution.launchers.result import LaunchResult
from repros.catalog.f9_modules_to_save_zero3 import SPEC as F9
from repros.catalog.f12_zero3_mixed_dtype_gather import SCENARIO as F12_SCENARIO
from repros.catalog.f12_zero3_mixed_dtype_gather import SPEC as F12
from repros.catalog.f12_zero3_mixed_dtype_gather import float32_against_16_bit
from repros.catalog.f13_zero3_modules_to_save_ds_grads_remaining import SCENARIO as F13_SCENARIO
from repros.catalog.f13_zero3_modules_to_save_ds_grads_remaining import SPEC as F13
from repros.catalog.f21_zero3_moe_routing_hang import SCENARIO as F21_SCENARIO
from repros.catalog.f21_zero3_moe_routing_hang import SPEC as F21
from repros.trainer.guards import Versions, apply_guards, choose_guards
from repros.trainer.moe import ZeRO3GathersDiverged
from tests.support.rank_records import error_record, failed_launch

RECORDED = Path(__file__).resolve().parent.parent / "support" / "recorded"
F12_GLOO = (RECORDED / "f12_gloo_invalid_tensor_type_deepspeed-0.19.2_transformers-5.23.0.txt").read_text()
F13_TEXT = (RECORDED / "f13_ds_grads_remaining_deepspeed-0.19.2_transformers-5.23.0.txt").read_text()
F9_DS_NEAR_MISS = (RECORDED / "f9_near_miss_ds_grads_remaining_deepspeed-0.19.2.txt").read_text()
F21_TEXT = (RECORDED / "f21_gathers_diverged_deepspeed-0.17.6_transformers-4.57.6.txt").read_text()
DIVERGED = "repros.trainer.moe.ZeRO3GathersDiverged"

#: What the failing ranks recorded about their scenarios (the fixed trainer's ``scenario_facts``).
F12_FACTS = {"engine": "deepspeed", "quantization": None, "zero_init": True, "bf16": True}
F21_FACTS = {"engine": "deepspeed", "moe_experts": 32, "zero3_moe_leaf_modules": False}
#: DeepSpeed#8072 (NCCL, deepspeed 0.19.2, TRL SFT with PEFT LoRA).
F12_NCCL = "output tensor must have the same type as input tensor"
#: DeepSpeed PR #5008's thread (Mixtral under ZeRO-3, NCCL).
F21_NCCL = (
    "[Rank 3] NCCL watchdog thread terminated with exception: [Rank 3] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=211067, OpType=_ALLGATHER_BASE, NumelIn=2359296, NumelOut=18874368, "
    "Timeout(ms)=1800000) ran for 1800561 milliseconds before timing out."
)


def failing_launch(etype: str, message: str, facts: dict[str, Any] | None = None) -> LaunchResult:
    return failed_launch({0: error_record(0, etype, message, facts=facts)}, exitcodes={0: 1})


def observed(spec: Any, etype: str, message: str, facts: dict[str, Any] | None = None) -> tuple[str, str | None]:
    obs = classify("bug", spec, failing_launch(etype, message, facts))
    return obs.outcome, obs.signature


def versions(**found: str) -> Versions:
    return {name: Version(v) for name, v in found.items()}


def ids(scenario: Any, at: Versions) -> list[str]:
    return [g.id for g in choose_guards(scenario, at)]


# -- F12 ------------------------------------------------------------------------------------------------


def test_f12_recorded_gloo_text_names_a_float32_buffer_and_a_bf16_partition() -> None:
    assert "dtype=float" in F12_GLOO and "dtype=c10::BFloat16" in F12_GLOO
    assert float32_against_16_bit(F12_GLOO)
    assert observed(F12, "RuntimeError", F12_GLOO, F12_FACTS) == (REPRODUCED, "F12.gloo-invalid-tensor-type")


def test_f12_a_gather_of_other_dtypes_is_not_f12() -> None:
    # A quantized base gathered beside bf16 modules (QLoRA, DeepSpeed#5049): uint8 against bf16.
    quantized = F12_GLOO.replace("dtype=float,", "dtype=unsigned char,", 1)
    assert not float32_against_16_bit(quantized)
    assert observed(F12, "RuntimeError", quantized, F12_FACTS)[0] == DIFFERENT_ERROR


def test_f12_nccl_wording_counts_for_a_bf16_zero_init_run_without_quantization() -> None:
    assert observed(F12, "TypeError", F12_NCCL, F12_FACTS) == (REPRODUCED, "F12.output-tensor-type")
    # The same words from QLoRA + ZeRO-3 (DeepSpeed#5049) or a model loaded whole: not F12.
    assert observed(F12, "TypeError", F12_NCCL, {**F12_FACTS, "quantization": "nf4"})[0] == DIFFERENT_ERROR
    assert observed(F12, "TypeError", F12_NCCL, {**F12_FACTS, "zero_init": False})[0] == DIFFERENT_ERROR
    assert observed(F12, "TypeError", F12_NCCL, None)[0] == DIFFERENT_ERROR


def test_f12_guard_keeps_the_adapters_in_the_base_dtype_on_0_19_2_only() -> None:
    at = versions(deepspeed="0.19.2", peft="0.21.2")
    assert "zero3-adapters-in-base-dtype" in ids(F12_SCENARIO, at)
    assert apply_guards(F12_SCENARIO, choose_guards(F12_SCENARIO, at)).peft_autocast_adapter_dtype is False
    for deepspeed in ("0.19.1", "0.19.3", "0.19.8"):
        assert "zero3-adapters-in-base-dtype" not in ids(F12_SCENARIO, versions(deepspeed=deepspeed, peft="0.21.2"))
    # peft before autocast_adapter_dtype existed; a model loaded whole; float32; a quantized base.
    assert "zero3-adapters-in-base-dtype" not in ids(F12_SCENARIO, versions(deepspeed="0.19.2", peft="0.11.1"))
    for other in ({"zero_init": False}, {"bf16": False}, {"quantization": "nf4"}):
        scenario = F12_SCENARIO.__class__(**{**F12_SCENARIO.__dict__, **other})
        assert "zero3-adapters-in-base-dtype" not in ids(scenario, at)


# -- F13 ------------------------------------------------------------------------------------------------


def test_f13_recorded_text_and_f9s_near_miss_are_f13() -> None:
    assert observed(F13, "AttributeError", F13_TEXT) == (REPRODUCED, "F13.ds-grads-remaining")
    assert observed(F13, "AttributeError", F9_DS_NEAR_MISS) == (REPRODUCED, "F13.ds-grads-remaining")
    # F9's own expectations stay: its bug mode there is a different error (this one).
    facts = {"engine": "deepspeed", "modules_to_save": ["embed_tokens", "lm_head"]}
    assert observed(F9, "AttributeError", F9_DS_NEAR_MISS, facts)[0] == DIFFERENT_ERROR


def test_f13_another_missing_attribute_is_not_f13() -> None:
    text = "'Linear' object has no attribute 'ds_id'"
    assert observed(F13, "AttributeError", text)[0] == DIFFERENT_ERROR


@pytest.mark.parametrize(
    ("deepspeed", "zero2"),
    [("0.16.4", False), ("0.16.5", True), ("0.18.0", True), ("0.19.2", True), ("0.19.3", False)],
)
def test_f13_guard_trains_zero2_on_the_affected_releases_only(deepspeed: str, zero2: bool) -> None:
    at = versions(deepspeed=deepspeed)
    assert ("zero2-for-modules-to-save" in ids(F13_SCENARIO, at)) is zero2
    effective = apply_guards(F13_SCENARIO, choose_guards(F13_SCENARIO, at))
    assert effective.zero_stage == (2 if zero2 else 3)


def test_f13_guard_names_f13() -> None:
    from repros.trainer.guards import GUARDS

    (rule,) = [r for r in GUARDS.values() if r.id == "zero2-for-modules-to-save"]
    assert rule.works_around == "F13" and "F13" in rule.reason(versions(deepspeed="0.19.2"))


# -- F21 ------------------------------------------------------------------------------------------------


def test_f21_the_exception_name_is_the_class_the_ranks_raise() -> None:
    assert f"{ZeRO3GathersDiverged.__module__}.{ZeRO3GathersDiverged.__qualname__}" == DIVERGED


def test_f21_recorded_text_names_two_experts_of_one_layer() -> None:
    assert "layers.0.block_sparse_moe.experts." in F21_TEXT and "rank 1 gathers" in F21_TEXT
    assert observed(F21, DIVERGED, F21_TEXT, F21_FACTS) == (REPRODUCED, "F21.gathers-diverged")


def test_f21_needs_an_moe_model_without_leaf_modules() -> None:
    assert observed(F21, DIVERGED, F21_TEXT, {**F21_FACTS, "zero3_moe_leaf_modules": True})[0] == DIFFERENT_ERROR
    assert observed(F21, DIVERGED, F21_TEXT, {**F21_FACTS, "moe_experts": 0})[0] == DIFFERENT_ERROR
    assert observed(F21, DIVERGED, F21_TEXT, None)[0] == DIFFERENT_ERROR


def test_f21_nccl_watchdog_on_an_all_gather_of_an_moe_model() -> None:
    for etype in ("torch.distributed.DistBackendError", "RuntimeError"):
        assert observed(F21, etype, F21_NCCL, F21_FACTS) == (REPRODUCED, "F21.nccl-allgather-timeout")
    # The same watchdog on an all-reduce (a slow rank, a dead node), or on a dense model: not F21.
    allreduce = F21_NCCL.replace("_ALLGATHER_BASE", "ALLREDUCE")
    assert observed(F21, "RuntimeError", allreduce, F21_FACTS)[0] == DIFFERENT_ERROR
    assert observed(F21, "RuntimeError", F21_NCCL, {**F21_FACTS, "moe_experts": 0})[0] == DIFFERENT_ERROR


@pytest.mark.parametrize(
    ("deepspeed", "transformers", "leaf"),
    [
        ("0.17.6", "4.57.6", True),
        ("0.16.9", "4.43.0", True),
        ("0.18.0", "4.57.6", False),  # PR #7604: Mixtral's blocks are leaf modules by default
        ("0.17.6", "5.23.0", False),  # transformers 5: a layer's experts are one module
    ],
)
def test_f21_guard_marks_the_moe_blocks_leaf_where_nothing_else_does(
    deepspeed: str, transformers: str, leaf: bool
) -> None:
    at = versions(deepspeed=deepspeed, transformers=transformers)
    assert ("zero3-moe-leaf-modules" in ids(F21_SCENARIO, at)) is leaf
    assert apply_guards(F21_SCENARIO, choose_guards(F21_SCENARIO, at)).zero3_moe_leaf_modules is leaf
    # A dense model needs nothing.
    dense = F21_SCENARIO.__class__(**{**F21_SCENARIO.__dict__, "moe_experts": 0})
    assert "zero3-moe-leaf-modules" not in ids(dense, at)


# -- the grid -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("etype", "message", "facts", "signature"),
    [
        ("RuntimeError", F12_GLOO, F12_FACTS, "F12.gloo-invalid-tensor-type"),
        ("AttributeError", F13_TEXT, {"engine": "deepspeed", "modules_to_save": ["lm_head"]}, "F13.ds-grads-remaining"),
        (DIVERGED, F21_TEXT, F21_FACTS, "F21.gathers-diverged"),
    ],
    ids=["F12", "F13", "F21"],
)
def test_a_grid_combination_that_fails_so_is_named_by_the_new_signature(
    etype: str, message: str, facts: dict[str, Any], signature: str
) -> None:
    from harness.config.repros import discover
    from harness.execution.classify import classify

    known = [r.spec for r in discover().repros.values()]
    observed = classify("scenario", None, failing_launch(etype, message, facts), known)
    assert (observed.outcome, observed.signature) == (REPRODUCED, signature)
