"""F6 and F8 signatures on recorded failure texts, with their near-misses and confounders.

Recorded texts (tests/support/recorded/):
- ``f6_marked_ready_twice_torch-2.13.0_transformers-4.57.6``: rank 0's message in F6's bug mode
  (harness run, cell ``tf4``: torch 2.13.0 CPU, peft 0.21.2).
- ``f6_marked_ready_twice_unnamed_torch-2.0.1_transformers-4.40.2``: the same, cell
  ``torch-2.0-tf4.40`` (peft 0.10.0): torch 2.0 gives the index and no name.
- ``f8_uniform_requires_grad_torch-2.13.0_transformers-5.23.0``: F8's bug mode (cell ``current``).
- ``f8_flatparameter_uniform_requires_grad_upstream_pytorch-104690``: torch 2.0's wording as
  reported upstream (pytorch/pytorch#104690, mosaicml/llm-foundry#414); FSDP1 of torch 2.0 needs
  CUDA before it gets there, so it is not recorded on this CPU machine.
- ``f8_near_miss_no_accelerator_torch-2.13.0``: FSDP1 on a CPU without ``device_id``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.execution.classify import DIFFERENT_ERROR, REPRODUCED, classify
from harness.execution.launchers.result import LaunchResult
from repros.catalog.f5_reentrant_frozen_base import SPEC as F5
from repros.catalog.f6_ddp_reentrant_ready_twice import SPEC as F6
from repros.catalog.f6_ddp_reentrant_ready_twice import names_an_adapter_twice_ready
from repros.catalog.f8_fsdp1_uniform_requires_grad import SPEC as F8
from tests.support.rank_records import error_record, failed_launch

RECORDED = Path(__file__).resolve().parent.parent / "support" / "recorded"
F6_TEXT = (RECORDED / "f6_marked_ready_twice_torch-2.13.0_transformers-4.57.6.txt").read_text()
F6_UNNAMED = (RECORDED / "f6_marked_ready_twice_unnamed_torch-2.0.1_transformers-4.40.2.txt").read_text()
F8_TEXT = (RECORDED / "f8_uniform_requires_grad_torch-2.13.0_transformers-5.23.0.txt").read_text()
F8_OLD = (RECORDED / "f8_flatparameter_uniform_requires_grad_upstream_pytorch-104690.txt").read_text()
F8_NO_ACCELERATOR = (RECORDED / "f8_near_miss_no_accelerator_torch-2.13.0.txt").read_text()
NO_GRAD_FN = (RECORDED / "f5_no_grad_fn_torch-2.13.0_deepspeed-0.18.0_transformers-4.57.6.txt").read_text()

#: What F6's failing rank recorded about its scenario (cell tf4).
F6_FACTS = {
    "engine": "ddp",
    "adapter": "lora",
    "lora_impl": "peft",
    "trainable_parameters": 3584,
    "frozen_embedding": True,
    "checkpointing": "reentrant",
    "input_require_grads": False,
    "embedding_output_requires_grad": True,
    "ddp_find_unused_parameters": True,
}


def failing_launch(etype: str, message: str, facts: dict[str, Any] | None = None) -> LaunchResult:
    return failed_launch({0: error_record(0, etype, message, facts=facts)}, exitcodes={0: 1})


def test_f6_recorded_text_is_f6() -> None:
    assert "lora_B" in F6_TEXT and "has been marked as ready twice" in F6_TEXT
    obs = classify("bug", F6, failing_launch("RuntimeError", F6_TEXT, F6_FACTS))
    assert (obs.outcome, obs.signature) == (REPRODUCED, "F6.marked-ready-twice")


def test_f6_torch_2_0_wording_without_a_name_is_f6_with_its_facts() -> None:
    assert "with name" not in F6_UNNAMED
    assert names_an_adapter_twice_ready(F6_UNNAMED)
    obs = classify("bug", F6, failing_launch("RuntimeError", F6_UNNAMED, F6_FACTS))
    assert (obs.outcome, obs.signature) == (REPRODUCED, "F6.marked-ready-twice")


@pytest.mark.parametrize(
    "name",
    ["model.embed_tokens.weight", "base_model.model.lm_head.weight", "module.encoder.shared.weight"],
)
def test_f6_a_base_parameter_marked_twice_is_not_f6(name: str) -> None:
    # Reason 1 of the text: a (shared) parameter used outside forward, not a checkpointed adapter.
    text = F6_TEXT.replace("base_model.model.model.layers.1.self_attn.v_proj.lora_B.default.weight", name)
    assert name in text and not names_an_adapter_twice_ready(text)
    assert classify("bug", F6, failing_launch("RuntimeError", text, F6_FACTS)).outcome == DIFFERENT_ERROR


@pytest.mark.parametrize(
    "facts",
    [
        {**F6_FACTS, "checkpointing": "non-reentrant"},
        {**F6_FACTS, "checkpointing": "off"},
        {**F6_FACTS, "engine": "deepspeed"},
        {**F6_FACTS, "trainable_parameters": 0},
    ],
    ids=["non-reentrant", "no-checkpointing", "not-ddp", "nothing-trainable"],
)
def test_f6_needs_ddp_under_reentrant_checkpointing(facts: dict[str, Any]) -> None:
    assert classify("bug", F6, failing_launch("RuntimeError", F6_TEXT, facts)).outcome == DIFFERENT_ERROR


def test_f6_needs_the_scenario_facts_to_claim_a_reproduction() -> None:
    assert classify("bug", F6, failing_launch("RuntimeError", F6_TEXT, None)).outcome == DIFFERENT_ERROR


def test_f5_and_f6_do_not_take_each_others_errors() -> None:
    # Checkpointing enabled after get_peft_model without input grads on transformers 4: F5 first.
    f5_facts = {**F6_FACTS, "embedding_output_requires_grad": False}
    assert classify("bug", F6, failing_launch("RuntimeError", NO_GRAD_FN, f5_facts)).outcome == DIFFERENT_ERROR
    assert classify("bug", F5, failing_launch("RuntimeError", F6_TEXT, F6_FACTS)).outcome == DIFFERENT_ERROR


def test_f6_other_ddp_reducer_errors_are_not_f6() -> None:
    unused = (
        "Expected to have finished reduction in the prior iteration before starting a new one. This error "
        "indicates that your module has parameters that were not used in producing loss."
    )
    assert classify("bug", F6, failing_launch("RuntimeError", unused, F6_FACTS)).outcome == DIFFERENT_ERROR


@pytest.mark.parametrize("text", [F8_TEXT, F8_OLD], ids=["torch-2.1+", "torch-2.0"])
def test_f8_both_wordings_are_one_signature(text: str) -> None:
    obs = classify("bug", F8, failing_launch("ValueError", text))
    assert (obs.outcome, obs.signature) == (REPRODUCED, "F8.uniform-requires-grad")


@pytest.mark.parametrize(
    "etype, text",
    [
        ("ValueError", "Must flatten tensors with uniform dtype but got torch.bfloat16 and torch.float32"),
        ("RuntimeError", F8_NO_ACCELERATOR),
        ("ValueError", "Must flatten tensors on the same device but got both cpu and cuda:0"),
        ("RuntimeError", F8_TEXT),
    ],
    ids=["uniform-dtype", "no-accelerator", "uniform-device", "wrong-exception-type"],
)
def test_f8_near_misses(etype: str, text: str) -> None:
    assert classify("bug", F8, failing_launch(etype, text)).outcome == DIFFERENT_ERROR
