"""F7, F9 and F10 signatures on recorded failure texts, with their near-misses and confounders.

Recorded texts (tests/support/recorded/), each the failing rank's message in a harness run (torch
2.13.0 CPU, 2 ranks, gloo):
- ``f7_reloaded_adapter_differs_...``: F7's bug mode in cell ``tf4``: ``Trainer.save_model`` wrote a
  40-byte adapter; reloaded, it gives the untrained base's logits.
- ``f7_size_mismatch_shape_0_...``: the same training saved by PEFT's ``save_pretrained`` on rank 0
  without gathering (the own loop's default save): every LoRA tensor ``torch.Size([0])``.
- ``f9_modules_to_save_shape_0_...``: F9's bug mode in cell ``tf4-peft-0.15.0``.
- ``f9_near_miss_ds_grads_remaining_...``: F9's scenario on deepspeed 0.19.2 (DeepSpeed#7615).
- ``f10_vocab_size_0_...``: F10's bug mode in cell ``tf-4.43.0``.
- ``f10_index_out_of_range_padded_...``: the same with the new pad id in every row.
- ``f10_silent_inconsistent_no_pad_multiple_...``: the same without ``pad_to_multiple_of`` and with
  no new id in the batch: training runs; the check after it finds the embedding 128 rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.execution.classify import DIFFERENT_ERROR, REPRODUCED, classify
from harness.execution.launchers.result import LaunchResult
from repros.catalog.f7_zero3_empty_adapter_save import SPEC as F7
from repros.catalog.f9_modules_to_save_zero3 import SPEC as F9
from repros.catalog.f9_modules_to_save_zero3 import only_modules_to_save_came_back_empty
from repros.catalog.f10_resize_embeddings_zero3 import SPEC as F10
from repros.trainer.resize_check import ResizedEmbeddingsInconsistent, raise_if_inconsistent
from repros.trainer.silent_failures import ReloadedAdapterDiffers
from tests.support.rank_records import error_record, failed_launch

RECORDED = Path(__file__).resolve().parent.parent / "support" / "recorded"


def recorded(name: str) -> str:
    return (RECORDED / name).read_text()


F7_SILENT = recorded("f7_reloaded_adapter_differs_transformers-4.57.6_deepspeed-0.19.8.txt")
F7_SHAPE_0 = recorded("f7_size_mismatch_shape_0_transformers-5.23.0_peft-0.21.2.txt")
F9_TEXT = recorded("f9_modules_to_save_shape_0_peft-0.15.0_transformers-4.57.6.txt")
F9_DS_NEAR_MISS = recorded("f9_near_miss_ds_grads_remaining_deepspeed-0.19.2.txt")
F10_VOCAB_0 = recorded("f10_vocab_size_0_transformers-4.43.0_deepspeed-0.19.8.txt")
F10_INDEX = recorded("f10_index_out_of_range_padded_transformers-4.43.0_deepspeed-0.19.8.txt")
F10_SILENT = recorded("f10_silent_inconsistent_no_pad_multiple_transformers-4.43.0_deepspeed-0.19.8.txt")
RELOADED = "repros.trainer.silent_failures.ReloadedAdapterDiffers"
INCONSISTENT = "repros.trainer.resize_check.ResizedEmbeddingsInconsistent"

#: What F10's failing rank recorded about its scenario (cell tf-4.43.0).
F10_FACTS = {"engine": "deepspeed", "trainer_loop": "own", "zero_init": True, "added_tokens": 1}


def failing_launch(etype: str, message: str, facts: dict[str, Any] | None = None) -> LaunchResult:
    return failed_launch({0: error_record(0, etype, message, facts=facts)}, exitcodes={0: 1})


def observed(spec: Any, etype: str, message: str, facts: dict[str, Any] | None = None) -> tuple[str, str | None]:
    obs = classify("bug", spec, failing_launch(etype, message, facts))
    return obs.outcome, obs.signature


def test_the_exception_names_are_the_classes_the_ranks_raise() -> None:
    assert f"{ReloadedAdapterDiffers.__module__}.{ReloadedAdapterDiffers.__qualname__}" == RELOADED
    assert f"{ResizedEmbeddingsInconsistent.__module__}.{ResizedEmbeddingsInconsistent.__qualname__}" == INCONSISTENT


def test_f7_silent_empty_adapter_is_caught_by_its_logits() -> None:
    assert "'adapter_model.safetensors': 40" in F7_SILENT and "0 to the untrained base" in F7_SILENT
    assert observed(F7, RELOADED, F7_SILENT) == (REPRODUCED, "F7.reloaded-adapter-differs")


def test_f7_shape_0_adapter_fails_to_load() -> None:
    assert observed(F7, "RuntimeError", F7_SHAPE_0) == (REPRODUCED, "F7.size-mismatch-shape-0")


def test_f7_does_not_take_f9s_modules_to_save_only_failure_and_the_reverse() -> None:
    assert observed(F7, "RuntimeError", F9_TEXT)[0] == DIFFERENT_ERROR
    assert not only_modules_to_save_came_back_empty(F7_SHAPE_0)
    assert observed(F9, "RuntimeError", F7_SHAPE_0)[0] == DIFFERENT_ERROR


@pytest.mark.parametrize(
    "text",
    [
        # A real shape mismatch (another rank r), not a ZeRO-3 shard.
        "Error(s) in loading state_dict for PeftModelForCausalLM:\n\tsize mismatch for base_model.model.model.layers"
        ".0.self_attn.q_proj.lora_A.default.weight: copying a param with shape torch.Size([16, 64]) from checkpoint, "
        "the shape in current model is torch.Size([8, 64]).",
        # A full model (no adapter) saved from ZeRO-3 shards: transformers#20082, not a LoRA adapter.
        "Error(s) in loading state_dict for Qwen2ForCausalLM:\n\tsize mismatch for model.layers.0.self_attn.k_proj"
        ".weight: copying a param with shape torch.Size([0]) from checkpoint, the shape in current model is "
        "torch.Size([512, 3584]).",
    ],
    ids=["other-rank", "full-model-not-adapter"],
)
def test_f7_near_misses(text: str) -> None:
    assert observed(F7, "RuntimeError", text)[0] == DIFFERENT_ERROR


def test_f9_recorded_text_is_f9() -> None:
    assert only_modules_to_save_came_back_empty(F9_TEXT)
    assert observed(F9, "RuntimeError", F9_TEXT) == (REPRODUCED, "F9.modules-to-save-shape-0")


def test_f9_deepspeed_7615_is_a_different_error() -> None:
    facts = {"engine": "deepspeed", "modules_to_save": ["embed_tokens", "lm_head"]}
    assert observed(F9, "AttributeError", F9_DS_NEAR_MISS, facts)[0] == DIFFERENT_ERROR


def test_f9_a_modules_to_save_copy_of_another_size_is_not_f9() -> None:
    resized = F9_TEXT.replace("torch.Size([0]) from checkpoint", "torch.Size([129, 64]) from checkpoint")
    assert not only_modules_to_save_came_back_empty(resized)
    assert observed(F9, "RuntimeError", resized)[0] == DIFFERENT_ERROR


def test_f10_vocab_size_0_is_the_upstream_wording() -> None:
    assert F10_VOCAB_0.startswith("shape '[-1, 0]' is invalid for input of size")
    assert observed(F10, "RuntimeError", F10_VOCAB_0, F10_FACTS) == (REPRODUCED, "F10.vocab-size-0")
    # transformers#26398's report (4.33.2), same text with another size.
    upstream = "shape '[-1, 0]' is invalid for input of size 32705022"
    assert observed(F10, "RuntimeError", upstream) == (REPRODUCED, "F10.vocab-size-0")


def test_f10_out_of_range_counts_only_for_a_resize_under_zero_init() -> None:
    assert observed(F10, "IndexError", F10_INDEX, F10_FACTS) == (REPRODUCED, "F10.new-token-out-of-range")
    # The same IndexError from a batch with ids past any vocabulary, nothing resized: not F10.
    assert observed(F10, "IndexError", F10_INDEX, {**F10_FACTS, "added_tokens": 0})[0] == DIFFERENT_ERROR
    assert observed(F10, "IndexError", F10_INDEX, {**F10_FACTS, "zero_init": False})[0] == DIFFERENT_ERROR
    assert observed(F10, "IndexError", F10_INDEX, None)[0] == DIFFERENT_ERROR


def test_f10_silent_form() -> None:
    assert "embedding rows 128, LM head rows 129, config.vocab_size 129" in F10_SILENT
    assert observed(F10, INCONSISTENT, F10_SILENT, F10_FACTS) == (REPRODUCED, "F10.silent-inconsistent-vocabulary")


def test_f10_other_reshape_errors_are_not_f10() -> None:
    assert observed(F10, "RuntimeError", "shape '[-1, 128]' is invalid for input of size 3840", F10_FACTS)[0] == (
        DIFFERENT_ERROR
    )


def test_resize_check_accepts_agreeing_sizes_padded_past_the_request() -> None:
    raise_if_inconsistent({"embedding_rows": 192, "lm_head_rows": 192, "config_vocab_size": 192}, at_least=129)
    with pytest.raises(ResizedEmbeddingsInconsistent):
        raise_if_inconsistent({"embedding_rows": 128, "lm_head_rows": 128, "config_vocab_size": 128}, at_least=129)
    with pytest.raises(ResizedEmbeddingsInconsistent):
        raise_if_inconsistent({"embedding_rows": 192, "lm_head_rows": 128, "config_vocab_size": 0}, at_least=129)
