"""The fixed trainer picks its guards from the scenario and the installed versions."""

from __future__ import annotations

import pytest
from packaging.version import Version

from repros.common import fixed_trainer
from repros.common.fixed_trainer import Scenario, apply_guards, choose_guards

F1_SCENARIO = Scenario(zero_stage=3, gradient_checkpointing=True, use_reentrant=False)


def with_deepspeed(monkeypatch: pytest.MonkeyPatch, version: str | None) -> None:
    monkeypatch.setattr(fixed_trainer, "_version", lambda package: Version(version) if version else None)


def ids(guards: list[fixed_trainer.Guard]) -> list[str]:
    return [g.id for g in guards]


def test_affected_deepspeed_gets_reentrant_checkpointing_with_input_grads(monkeypatch: pytest.MonkeyPatch) -> None:
    with_deepspeed(monkeypatch, "0.19.2")
    guards = choose_guards(F1_SCENARIO)
    assert ids(guards) == ["use-cache-off", "zero3-reentrant-checkpointing", "input-require-grads"]
    effective = apply_guards(F1_SCENARIO, guards)
    assert effective.use_reentrant and effective.input_require_grads and effective.use_cache is False


def test_fixed_deepspeed_keeps_the_users_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    with_deepspeed(monkeypatch, "0.19.3")
    guards = choose_guards(F1_SCENARIO)
    assert ids(guards) == ["use-cache-off"]
    assert apply_guards(F1_SCENARIO, guards).use_reentrant is False


def test_zero2_needs_no_f1_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    with_deepspeed(monkeypatch, "0.19.2")
    assert "zero3-reentrant-checkpointing" not in ids(choose_guards(Scenario(zero_stage=2)))


def test_reentrant_checkpointing_always_gets_input_grads(monkeypatch: pytest.MonkeyPatch) -> None:
    with_deepspeed(monkeypatch, "0.19.8")
    assert "input-require-grads" in ids(choose_guards(Scenario(use_reentrant=True)))


def with_versions(monkeypatch: pytest.MonkeyPatch, **versions: str) -> None:
    known = {name.replace("_", "-"): Version(v) for name, v in versions.items()}
    monkeypatch.setattr(fixed_trainer, "_version", lambda package: known.get(package))


def test_library_default_checkpointing_is_reentrant_on_transformers_4_only(monkeypatch: pytest.MonkeyPatch) -> None:
    f5 = Scenario(zero_stage=2, lora_impl="dschat", use_reentrant=None)
    with_versions(monkeypatch, deepspeed="0.19.8", transformers="4.57.6")
    assert "input-require-grads" in ids(choose_guards(f5))
    with_versions(monkeypatch, deepspeed="0.19.8", transformers="5.0.0")
    assert ids(choose_guards(f5)) == ["use-cache-off"]


def test_fsdp2_mixed_precision_gets_uniform_dtypes(monkeypatch: pytest.MonkeyPatch) -> None:
    with_versions(monkeypatch, deepspeed="0.19.2", transformers="4.57.6")
    f2 = Scenario(engine="fsdp2", adapter="dora", use_reentrant=False)
    guards = choose_guards(f2)
    assert ids(guards) == ["use-cache-off", "fsdp-uniform-dtypes"]
    assert apply_guards(f2, guards).fsdp_root_mixed_precision is True
    assert "fsdp-uniform-dtypes" not in ids(choose_guards(Scenario(engine="fsdp2", bf16=False)))


def test_quantized_add_adapter_model_is_wrapped_and_4bit_is_not_repacked(monkeypatch: pytest.MonkeyPatch) -> None:
    with_versions(monkeypatch, deepspeed="0.19.8", transformers="4.57.6")
    f3 = Scenario(peft_wrapping="add_adapter", quantization="int8", gradient_checkpointing=False)
    assert ids(choose_guards(f3)) == ["peft-model-wrap"]
    assert apply_guards(f3, choose_guards(f3)).peft_wrapping == "peft_model"
    nf4 = Scenario(quantization="nf4", gradient_checkpointing=False)
    assert ids(choose_guards(nf4)) == ["bnb-cpu-no-repack"]


def test_a_weight_sync_is_merged_first(monkeypatch: pytest.MonkeyPatch) -> None:
    with_versions(monkeypatch, deepspeed="0.19.8", transformers="5.23.0")
    f4 = Scenario(sync_weights=True, gradient_checkpointing=False)
    guards = choose_guards(f4)
    assert ids(guards) == ["merge-before-sync"]
    assert apply_guards(f4, guards).merge_before_sync is True
    assert choose_guards(Scenario(gradient_checkpointing=False)) == []
