"""F3's signatures on recorded failure texts, near-misses included.

Recorded texts (tests/support/recorded/f3_*):
- ``f3_to_8bit_transformers-4.57.6_bitsandbytes-0.50.2.txt``: the message rank 0 raised in
  F3's bug mode (harness run, torch 2.13.0 CPU, deepspeed 0.19.8, peft 0.21.2,
  transformers 4.57.6, bitsandbytes 0.50.2), from ``self.module.to(self.device)`` in
  DeepSpeed's engine.
- ``f3_to_4bit_or_8bit_source_transformers-4.44.2.txt`` and
  ``f3_to_4bit_source_transformers-4.57.6.txt``: the two wordings that cannot be raised on a
  CPU machine (the transformers releases with the first refuse to quantize without CUDA; the
  second needs bitsandbytes < 0.43.2, which has no CPU support), assembled from the string
  literals of ``PreTrainedModel.to`` in those releases' wheels (the device a GPU rank has).
- ``f3_to_8bit_needs_bnb_0.48_transformers-5.23.0_bitsandbytes-0.47.0.txt``: the same engine
  ``.to`` refused by transformers 5 (harness run, deepspeed 0.19.8, bitsandbytes 0.47.0).
- ``f3_infra_no_cuda_transformers-4.57.6_bitsandbytes-0.45.5.txt``: what transformers says
  when the installed bitsandbytes cannot quantize on CPU (harness run; the cell is INFRA).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.execution.classify import DIFFERENT_ERROR, INFRA, REPRODUCED, classify
from repros.catalog.f3_qlora_zero3_to import SPEC as F3
from repros.trainer.quantized import _unavailable_reason
from tests.support.rank_records import error_record, failed_launch, rank_record

RECORDED = Path(__file__).resolve().parent.parent / "support" / "recorded"
TO_8BIT = (RECORDED / "f3_to_8bit_transformers-4.57.6_bitsandbytes-0.50.2.txt").read_text()
TO_4BIT_OR_8BIT = (RECORDED / "f3_to_4bit_or_8bit_source_transformers-4.44.2.txt").read_text()
TO_4BIT = (RECORDED / "f3_to_4bit_source_transformers-4.57.6.txt").read_text()
TO_8BIT_NEEDS_BNB = (RECORDED / "f3_to_8bit_needs_bnb_0.48_transformers-5.23.0_bitsandbytes-0.47.0.txt").read_text()
INFRA_NO_CUDA = (RECORDED / "f3_infra_no_cuda_transformers-4.57.6_bitsandbytes-0.45.5.txt").read_text()


def matching(exception_type: str, message: str) -> list[str]:
    return [s.id for s in F3.signatures if s.matches(exception_type, message)]


@pytest.mark.parametrize(
    ("text", "signature"),
    [
        (TO_8BIT, "F3.to-8bit"),
        (TO_4BIT_OR_8BIT, "F3.to-4bit-or-8bit"),
        (TO_4BIT, "F3.to-4bit"),
        (TO_8BIT_NEEDS_BNB, "F3.to-8bit-needs-bnb-0.48"),
    ],
)
def test_each_recorded_wording_matches_exactly_its_signature(text: str, signature: str) -> None:
    assert matching("ValueError", text) == [signature]


def test_the_recorded_message_is_the_engines_to() -> None:
    assert TO_8BIT.startswith("`.to` is not supported for `8-bit` bitsandbytes models.")


def test_another_exception_type_with_the_same_text_does_not_match() -> None:
    assert matching("RuntimeError", TO_8BIT) == []
    assert matching("transformers.ValueError", TO_8BIT) == []


NEAR_MISSES = {
    # PreTrainedModel.to with a dtype: a ValueError about .to on a bitsandbytes model, but a cast.
    "cast-dtype": "You cannot cast a bitsandbytes model in a new `dtype`. Make sure to load the model using "
    "`from_pretrained` using the desired `dtype` by passing the correct `dtype` argument.",
    # .cuda(), not .to
    "cuda-8bit": "Calling `cuda()` is not supported for `8-bit` quantized models.  Please use the model as it is, "
    "since the model has already been set to the correct devices.",
    "cuda-4bit-or-8bit": "Calling `cuda()` is not supported for `4-bit` or `8-bit` quantized models. Please use the "
    "model as it is, since the model has already been set to the correct devices and casted to the correct `dtype`.",
    "half": "`.half()` is not supported for quantized model. Please use the model as it is, since the model has "
    "already been casted to the correct `dtype`.",
    # .to refused for another quantization method
    "quark": "Casting a Quark quantized model to a new `dtype` is not supported.",
    # transformers 5's 8-bit .cuda() refusal, and a to() message about a 4-bit model elsewhere
    "needs-bnb-4bit": "You need to install `pip install bitsandbytes>=0.43.2` if you want to move a 4-bit model "
    "across devices using cuda().",
    # a `.to` message about something else entirely
    "to-other": "`.to` is not supported for sparse tensors with layout torch.sparse_csr.",
    # quantization itself refused on this device: INFRA, not the engine's .to
    "no-gpu": "No GPU found. A GPU is needed for quantization.",
    "no-cuda": INFRA_NO_CUDA,
}


@pytest.mark.parametrize("name", sorted(NEAR_MISSES))
def test_near_misses_do_not_match(name: str) -> None:
    assert matching("ValueError", NEAR_MISSES[name]) == []
    assert matching("RuntimeError", NEAR_MISSES[name]) == []


def test_device_refusals_are_scenario_unavailable_and_signatures_are_not() -> None:
    assert _unavailable_reason(RuntimeError(INFRA_NO_CUDA)) is not None
    assert _unavailable_reason(RuntimeError("No GPU found. A GPU is needed for quantization.")) is not None
    assert _unavailable_reason(NotImplementedError("Device type not supported for FP4 quantization: cpu")) is not None
    for text in (TO_8BIT, TO_4BIT_OR_8BIT, TO_4BIT, TO_8BIT_NEEDS_BNB, NEAR_MISSES["cast-dtype"]):
        assert _unavailable_reason(ValueError(text)) is None


def test_recorded_8bit_message_is_reproduced_in_bug_mode() -> None:
    observation = classify(
        "bug", F3, failed_launch({0: error_record(0, "ValueError", TO_8BIT), 1: error_record(1, "ValueError", TO_8BIT)})
    )
    assert observation.outcome == REPRODUCED
    assert observation.signature == "F3.to-8bit"


def test_cast_dtype_refusal_is_a_different_error() -> None:
    observation = classify(
        "bug", F3, failed_launch({0: error_record(0, "ValueError", NEAR_MISSES["cast-dtype"]), 1: None})
    )
    assert observation.outcome == DIFFERENT_ERROR


def test_unavailable_rank_is_infra() -> None:
    record = rank_record(0, "unavailable", unavailable_reason=f"RuntimeError: {INFRA_NO_CUDA}")
    assert classify("bug", F3, failed_launch({0: record, 1: None})).outcome == INFRA


def test_expectations_are_established_by_a_command() -> None:
    assert F3.expectations
    for expectation in F3.expectations:
        assert "python -m harness run" in expectation.established_by
