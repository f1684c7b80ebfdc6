"""F2 and F5 signatures on recorded failure texts, with their near-misses and confounders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.execution.classify import DIFFERENT_ERROR, REPRODUCED, classify
from harness.execution.launchers.result import LaunchResult
from repros.catalog.f1_zero3_frozen_ckpt import SPEC as F1
from repros.catalog.f2_dora_fsdp_ckpt_dtype import SPEC as F2
from repros.catalog.f5_reentrant_frozen_base import SPEC as F5
from repros.runtime.signatures import recomputed_dtype_float32_bfloat16
from repros.trainer.silent_failures import (
    LayerAdaptersGotNoGradient,
    layer_adapters_without_gradient,
    raise_if_layer_adapters_got_no_gradient,
)
from tests.support.rank_records import error_record, failed_launch

RECORDED = Path(__file__).resolve().parent.parent / "support" / "recorded"
F2_TEXT = (RECORDED / "f2_checkpoint_error_torch-2.12.1_transformers-4.57.6.txt").read_text()
F1_TEXT = (RECORDED / "f1_checkpoint_error_torch-2.13.0_deepspeed-0.19.2.txt").read_text()
F5_ASSERT_TEXT = (RECORDED / "f5_deepspeed_assert_torch-2.13.0_deepspeed-0.19.8_transformers-4.57.6.txt").read_text()
CKPT = "torch.utils.checkpoint.CheckpointError"
NO_GRAD_FN = (RECORDED / "f5_no_grad_fn_torch-2.13.0_deepspeed-0.18.0_transformers-4.57.6.txt").read_text()

#: What the F5 bug run recorded about itself (transformers 4.57.6, DeepSpeed-Chat LoRA).
F5_FACTS = {
    "engine": "deepspeed",
    "lora_impl": "dschat",
    "trainable_parameters": 16384,
    "frozen_embedding": True,
    "checkpointing": "reentrant",
    "input_require_grads": False,
}
#: DeepSpeed#3339: the same RuntimeError, but nothing trainable and no checkpointing.
DS3339_FACTS = {**F5_FACTS, "trainable_parameters": 0, "checkpointing": "off"}


def failing_launch(etype: str, message: str, facts: dict[str, Any] | None) -> LaunchResult:
    return failed_launch({0: error_record(0, etype, message, facts=facts)}, exitcodes={0: 1})


def test_f2_recorded_text_is_f2() -> None:
    obs = classify("bug", F2, failing_launch(CKPT, F2_TEXT, None))
    assert (obs.outcome, obs.signature) == (REPRODUCED, "F2.recompute-dtype")


def test_f1_and_f2_do_not_take_each_others_checkpoint_errors() -> None:
    assert classify("bug", F2, failing_launch(CKPT, F1_TEXT, None)).outcome == DIFFERENT_ERROR
    assert classify("bug", F1, failing_launch(CKPT, F2_TEXT, None)).outcome == DIFFERENT_ERROR


@pytest.mark.parametrize(
    "saved, recomputed",
    [
        ("'shape': torch.Size([4]), 'dtype': torch.float16", "'shape': torch.Size([4]), 'dtype': torch.float32"),
        ("'shape': torch.Size([4]), 'dtype': torch.bfloat16", "'shape': torch.Size([8]), 'dtype': torch.float32"),
        ("'shape': torch.Size([4]), 'dtype': torch.float32", "'shape': torch.Size([4]), 'dtype': torch.float32"),
    ],
    ids=["float16-not-bfloat16", "shape-changed-too", "nothing-differs"],
)
def test_f2_near_misses(saved: str, recomputed: str) -> None:
    text = (
        "torch.utils.checkpoint: Recomputed values for the following tensors have different metadata than during "
        "the forward pass.\ntensor at position 3:\n"
        f"saved metadata: {{{saved}, 'device': device(type='cpu')}}\n"
        f"recomputed metadata: {{{recomputed}, 'device': device(type='cpu')}}\n"
    )
    assert not recomputed_dtype_float32_bfloat16(text)
    assert classify("bug", F2, failing_launch(CKPT, text, None)).outcome == DIFFERENT_ERROR


def test_f5_deepspeed_assertion_recorded_text() -> None:
    obs = classify("bug", F5, failing_launch("AssertionError", F5_ASSERT_TEXT, F5_FACTS))
    assert (obs.outcome, obs.signature) == (REPRODUCED, "F5.deepspeed-loss-assert")


def test_f5_runtime_error_with_f5_facts() -> None:
    obs = classify("bug", F5, failing_launch("RuntimeError", NO_GRAD_FN, F5_FACTS))
    assert (obs.outcome, obs.signature) == (REPRODUCED, "F5.no-grad-fn")


@pytest.mark.parametrize("etype, text", [("RuntimeError", NO_GRAD_FN), ("AssertionError", F5_ASSERT_TEXT)])
def test_deepspeed_3339_zero_trainable_parameters_is_not_f5(etype: str, text: str) -> None:
    assert classify("bug", F5, failing_launch(etype, text, DS3339_FACTS)).outcome == DIFFERENT_ERROR


def test_f5_needs_the_scenario_facts_to_claim_a_reproduction() -> None:
    # A rank that failed before recording its scenario cannot be told apart from the confounder.
    assert classify("bug", F5, failing_launch("RuntimeError", NO_GRAD_FN, None)).outcome == DIFFERENT_ERROR


def test_f5_with_input_grads_or_non_reentrant_is_not_f5() -> None:
    for facts in ({**F5_FACTS, "input_require_grads": True}, {**F5_FACTS, "checkpointing": "non-reentrant"}):
        assert classify("bug", F5, failing_launch("RuntimeError", NO_GRAD_FN, facts)).outcome == DIFFERENT_ERROR


def test_silent_form_is_raised_only_when_every_layer_adapter_lacked_a_gradient() -> None:
    silent = {
        "adapter_grad_norms": {
            "model.layers.0.self_attn.q_proj.lora_right_weight": [None, None],
            "model.layers.1.self_attn.q_proj.lora_left_weight": [None, None],
            "lm_head.lora_right_weight": [0.3, 0.2],
        }
    }
    with pytest.raises(LayerAdaptersGotNoGradient) as caught:
        raise_if_layer_adapters_got_no_gradient(silent)
    obs = classify(
        "bug",
        F5,
        failing_launch("repros.trainer.silent_failures.LayerAdaptersGotNoGradient", str(caught.value), F5_FACTS),
    )
    assert (obs.outcome, obs.signature) == (REPRODUCED, "F5.silent-layer-adapters-no-grad")
    trained = {"adapter_grad_norms": {"model.layers.0.q.lora_right_weight": [None, 0.1]}}
    assert layer_adapters_without_gradient(trained["adapter_grad_norms"]) == []
    raise_if_layer_adapters_got_no_gradient(trained)
