"""F4's signatures on recorded failure texts, near-misses included.

Recorded texts (tests/support/recorded/f4_*):
- ``f4_keyerror_...``: the message of the KeyError rank 0 raised in F4's bug mode (harness run,
  cell ``current``: torch 2.13.0 CPU, deepspeed 0.19.8, peft 0.21.2, transformers 5.23.0).
- ``f4_strict_load_state_dict_...``: torch's strict ``load_state_dict`` of the tiny PEFT model's
  state dict into the plain tiny Qwen2 (same stack).
- ``f4_no_module_base_model_vllm-12961`` / ``..._openrlhf-991``: vLLM's AutoWeightsLoader text as
  reported upstream (vllm-project/vllm#12961, OpenRLHF/OpenRLHF#991). vLLM cannot run on this
  CPU machine, so these are the upstream reports' texts, not recorded here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.execution.classify import classify
from harness.records.rank import RankRecord
from repros.catalog.f4_lora_weight_sync import SPEC as F4
from repros.catalog.f4_lora_weight_sync import state_dict_keys, strict_load_rejects_peft_keys
from tests.support.rank_records import error_record, failed_launch, rank_record

RECORDED = Path(__file__).resolve().parent.parent / "support" / "recorded"
KEYERROR_TEXT = (RECORDED / "f4_keyerror_torch-2.13.0_deepspeed-0.19.8_peft-0.21.2.txt").read_text()
STRICT_TEXT = (RECORDED / "f4_strict_load_state_dict_torch-2.13.0_peft-0.21.2.txt").read_text()
VLLM_TEXTS = [
    (RECORDED / "f4_no_module_base_model_vllm-12961.txt").read_text(),
    (RECORDED / "f4_no_module_base_model_upstream_openrlhf-991.txt").read_text(),
]


def signature(sig_id: str) -> Any:
    sig = F4.signature(sig_id)
    assert sig is not None
    return sig


def matching(etype: str, message: str) -> list[str]:
    return [s.id for s in F4.signatures if s.matches(etype, message)]


def test_recorded_keyerror_is_the_peft_embedding_name() -> None:
    assert KEYERROR_TEXT == "'base_model.model.model.embed_tokens.weight'"
    assert matching("KeyError", KEYERROR_TEXT) == ["F4.keyerror-peft-name"]


def test_recorded_strict_load_lists_plain_missing_and_peft_unexpected_keys() -> None:
    missing = state_dict_keys(STRICT_TEXT, "missing")
    unexpected = state_dict_keys(STRICT_TEXT, "unexpected")
    assert "lm_head.weight" in missing and "model.embed_tokens.weight" in missing
    assert "base_model.model.model.embed_tokens.weight" in unexpected
    assert any(".lora_A." in k for k in unexpected)
    assert strict_load_rejects_peft_keys(STRICT_TEXT)
    assert matching("RuntimeError", STRICT_TEXT) == ["F4.strict-load-peft-keys"]


@pytest.mark.parametrize("text", VLLM_TEXTS)
def test_upstream_vllm_texts_match(text: str) -> None:
    assert matching("ValueError", text) == ["F4.no-module-peft-prefix"]


def test_rank0_keyerror_with_its_peer_stopped_in_the_gather_is_reproduced() -> None:
    closed = "[../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:45772"
    peer = error_record(1, "RuntimeError", closed)
    obs = classify("bug", F4, failed_launch({0: error_record(0, "KeyError", KEYERROR_TEXT), 1: peer}))
    assert obs.outcome == "REPRODUCED" and obs.signature == "F4.keyerror-peft-name"


def test_rank0_keyerror_with_its_peer_killed_by_torchrun_is_reproduced() -> None:
    records: dict[int, RankRecord | None] = {
        0: error_record(0, "KeyError", KEYERROR_TEXT),
        1: rank_record(1, "running", phase="run"),
    }
    obs = classify("bug", F4, failed_launch(records, exitcodes={0: 1, 1: -15}))
    assert obs.outcome == "REPRODUCED"


NEAR_MISSES = {
    "KeyError for a plain HF name (not PEFT's)": ("KeyError", "'model.embed_tokens.weight'"),
    "KeyError for a vLLM-packed name": ("KeyError", "'model.layers.0.self_attn.qkv_proj.weight'"),
    "KeyError for a PEFT name, but not a KeyError": ("AttributeError", KEYERROR_TEXT),
    "KeyError text embedded in a longer message": ("KeyError", f"lookup failed: {KEYERROR_TEXT} and more"),
    "strict load, only missing keys of another kind": (
        "RuntimeError",
        'Error(s) in loading state_dict for Qwen2ForCausalLM:\n\tMissing key(s) in state_dict: "lm_head.weight". ',
    ),
    "strict load, unexpected keys that are not PEFT's": (
        "RuntimeError",
        'Error(s) in loading state_dict for Qwen2ForCausalLM:\n\tMissing key(s) in state_dict: "lm_head.weight". '
        '\n\tUnexpected key(s) in state_dict: "model.rotary_emb.inv_freq", "score.weight". ',
    ),
    "strict load, PEFT keys unexpected but nothing missing": (
        "RuntimeError",
        "Error(s) in loading state_dict for Qwen2ForCausalLM:\n\t"
        'Unexpected key(s) in state_dict: "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight". ',
    ),
    "strict load, size mismatch only": (
        "RuntimeError",
        "Error(s) in loading state_dict for Qwen2ForCausalLM:\n\tsize mismatch for lm_head.weight: copying a param "
        "with shape torch.Size([128, 64]) from checkpoint, the shape in current model is torch.Size([256, 64]).",
    ),
    "vLLM loader on a name that is not PEFT's": (
        "ValueError",
        "There is no module or parameter named 'lm_head.qweight_type' in Qwen2ForCausalLM",
    ),
    "vLLM loader on a vision tower": ("ValueError", "There is no module or parameter named 'visual' in Qwen3_5Model"),
    "vLLM shape assertion": (
        "AssertionError",
        "Attempted to load weight (torch.Size([1024, 1])) into parameter (torch.Size([64, 64]))",
    ),
}


@pytest.mark.parametrize("name", sorted(NEAR_MISSES))
def test_near_misses_do_not_match(name: str) -> None:
    etype, message = NEAR_MISSES[name]
    assert matching(etype, message) == [], name


def test_near_miss_is_a_different_error_in_bug_mode() -> None:
    etype, message = NEAR_MISSES["KeyError for a plain HF name (not PEFT's)"]
    obs = classify("bug", F4, failed_launch({0: error_record(0, etype, message), 1: None}))
    assert obs.outcome == "DIFFERENT_ERROR"


def test_the_recorded_strict_text_without_its_peft_keys_does_not_match() -> None:
    head, _, _ = STRICT_TEXT.partition("\tUnexpected key(s)")
    assert not strict_load_rejects_peft_keys(head)
    assert matching("RuntimeError", head) == []


def test_expectations_are_established_by_a_command() -> None:
    assert {(e.mode, e.outcome) for e in F4.expectations} == {("bug", "REPRODUCED"), ("fixed", "PASS")}
    assert all("harness run" in e.established_by for e in F4.expectations)
