"""The fixed trainer picks its guards from the scenario and the installed versions."""

from __future__ import annotations

import pytest
from packaging.version import Version

from repros.catalog.f24_fsdp2_nf4_bf16_nan_canonical import SCENARIO as F24_SCENARIO
from repros.catalog.f25_zero3_liger_lm_head_shard import SCENARIO as F25_SCENARIO
from repros.catalog.f26_ulysses_peft_register import SCENARIO as F26_SCENARIO
from repros.catalog.f27_ulysses_zero0_mpu import SCENARIO as F27_SCENARIO
from repros.catalog.f28_fsdp2_context_parallel_skipped import SCENARIO as F28_SCENARIO
from repros.catalog.f29_zero3_target_parameters_shape import SCENARIO as F29_SCENARIO
from repros.catalog.f30_peft_torchao_import import SCENARIO as F30_SCENARIO
from repros.catalog.f31_fsdp2_peft_chunked_nll_dtensor import SCENARIO as F31_SCENARIO
from repros.catalog.f32_zero3_load_conversion_missing import SCENARIO as F32_SCENARIO
from repros.trainer.guards import GUARDS, Guard, Versions, apply_guards, choose_guards
from repros.trainer.scenario import Scenario

F1_SCENARIO = Scenario(zero_stage=3, gradient_checkpointing=True, use_reentrant=False)
#: DDP as HF Trainer builds it for a PEFT model, checkpointing (library default) before the adapter.
F6_SCENARIO = Scenario(
    engine="ddp", use_reentrant=None, checkpointing_before_adapter=True, ddp_find_unused_parameters=True
)
F8_SCENARIO = Scenario(engine="fsdp1", gradient_checkpointing=False, fsdp1_wrap="layer")
#: Saved by HF Trainer under ZeRO-3 (F7), with modules_to_save and the 16-bit gather on (F9).
F7_SCENARIO = Scenario(gradient_checkpointing=False, trainer_loop="hf", zero_init=True, save_adapter=True)
F9_SCENARIO = Scenario(
    gradient_checkpointing=False,
    trainer_loop="hf",
    zero_init=True,
    save_adapter=True,
    zero3_gather_16bit_on_save=True,
    modules_to_save=("embed_tokens", "lm_head"),
)
F10_SCENARIO = Scenario(gradient_checkpointing=False, zero_init=True, add_tokens=1, pad_to_multiple_of=64)


def versions(**found: str) -> Versions:
    return {name.replace("_", "-"): Version(v) for name, v in found.items()}


def ids(guards: list[Guard]) -> list[str]:
    return [g.id for g in guards]


def test_affected_deepspeed_gets_reentrant_checkpointing_with_input_grads() -> None:
    v = versions(deepspeed="0.19.2")
    guards = choose_guards(F1_SCENARIO, v)
    # 0.19.2 also waits only on the last gather of a coalesced gather (F17).
    # bf16 ZeRO before 0.19.8 also says every step it skips (F34).
    assert ids(guards) == [
        "use-cache-off",
        "zero3-reentrant-checkpointing",
        "input-require-grads",
        "zero3-wait-every-gather",
        "say-skipped-steps",
    ]
    effective = apply_guards(F1_SCENARIO, guards)
    assert effective.use_reentrant and effective.input_require_grads and effective.use_cache is False


def test_fixed_deepspeed_keeps_the_users_configuration() -> None:
    v = versions(deepspeed="0.19.8")
    guards = choose_guards(F1_SCENARIO, v)
    assert ids(guards) == ["use-cache-off"]
    assert apply_guards(F1_SCENARIO, guards).use_reentrant is False


def test_zero2_needs_no_f1_guard() -> None:
    v = versions(deepspeed="0.19.2")
    assert "zero3-reentrant-checkpointing" not in ids(choose_guards(Scenario(zero_stage=2), v))


def test_reentrant_checkpointing_always_gets_input_grads() -> None:
    v = versions(deepspeed="0.19.8")
    assert "input-require-grads" in ids(choose_guards(Scenario(use_reentrant=True), v))


def test_library_default_checkpointing_is_reentrant_on_transformers_4_only() -> None:
    f5 = Scenario(zero_stage=2, lora_impl="dschat", use_reentrant=None)
    v = versions(deepspeed="0.19.8", transformers="4.57.6")
    assert "input-require-grads" in ids(choose_guards(f5, v))
    v = versions(deepspeed="0.19.8", transformers="5.0.0")
    assert ids(choose_guards(f5, v)) == ["use-cache-off"]


def test_fsdp2_mixed_precision_gets_uniform_dtypes() -> None:
    v = versions(deepspeed="0.19.2", transformers="4.57.6")
    f2 = Scenario(engine="fsdp2", adapter="dora", use_reentrant=False)
    guards = choose_guards(f2, v)
    assert ids(guards) == ["use-cache-off", "fsdp-uniform-dtypes"]
    assert apply_guards(f2, guards).fsdp_root_mixed_precision is True
    assert "fsdp-uniform-dtypes" not in ids(choose_guards(Scenario(engine="fsdp2", bf16=False), v))


def test_quantized_add_adapter_model_is_wrapped_and_4bit_is_not_repacked() -> None:
    v = versions(deepspeed="0.19.8", transformers="4.57.6")
    f3 = Scenario(peft_wrapping="add_adapter", quantization="int8", gradient_checkpointing=False)
    assert ids(choose_guards(f3, v)) == ["peft-model-wrap"]
    assert apply_guards(f3, choose_guards(f3, v)).peft_wrapping == "peft_model"
    nf4 = Scenario(quantization="nf4", gradient_checkpointing=False)
    assert ids(choose_guards(nf4, v)) == ["bnb-cpu-no-repack"]


def test_a_weight_sync_is_merged_first() -> None:
    v = versions(deepspeed="0.19.8", transformers="5.23.0")
    f4 = Scenario(sync_weights=True, gradient_checkpointing=False)
    guards = choose_guards(f4, v)
    assert ids(guards) == ["merge-before-sync"]
    assert apply_guards(f4, guards).merge_before_sync is True
    assert choose_guards(Scenario(gradient_checkpointing=False), v) == []


def test_every_guard_applies_somewhere_and_its_effect_switches_it_off() -> None:
    assert len({rule.id for rule in GUARDS.values()}) == len(GUARDS)
    v = versions(deepspeed="0.19.2", transformers="4.57.6")
    candidates = [
        (F1_SCENARIO, v),
        (Scenario(zero_stage=2, lora_impl="dschat", use_reentrant=None), v),
        (Scenario(engine="fsdp2", adapter="dora"), v),
        (Scenario(quantization="nf4", peft_wrapping="add_adapter", gradient_checkpointing=False), v),
        (Scenario(sync_weights=True, gradient_checkpointing=False), v),
        (F6_SCENARIO, v),
        (F8_SCENARIO, v),
        (F7_SCENARIO, v),
        (F10_SCENARIO, versions(deepspeed="0.19.8", transformers="4.43.0")),
        (F9_SCENARIO, v),
        (Scenario(gradient_checkpointing=False, zero3_allgather_sequential=True), v),
        # F12: bf16, loaded inside zero.Init, PEFT's float32 adapters; F21: a Mixtral on transformers 4.x.
        (Scenario(gradient_checkpointing=False, zero_init=True), versions(deepspeed="0.19.2", peft="0.21.2")),
        (Scenario(gradient_checkpointing=False, moe_experts=32), versions(deepspeed="0.17.6", transformers="4.57.6")),
        # F15: FSDP2 over a cpu_ram_efficient_loading checkpoint; F16: the Trainer's FSDP2 adapter checkpoint.
        (Scenario(engine="fsdp2", bf16=False, fsdp_cpu_ram_efficient_loading=True), versions(transformers="5.5.4")),
        (Scenario(engine="fsdp2", bf16=False, fsdp2_trainer_adapter_checkpoint=True), versions(accelerate="1.14.0")),
        # F18: ZeRO-3 on transformers 5.0 .. 5.5.3 (one rotary_fn module shared by every model).
        (Scenario(gradient_checkpointing=False), versions(deepspeed="0.19.8", transformers="5.5.3")),
        # F14: QLoRA under FSDP2 on torch < 2.12; F19: LoRA dropout, checkpointing and torch.compile.
        (Scenario(engine="fsdp2", quantization="nf4", gradient_checkpointing=False), versions(torch="2.11.0")),
        (Scenario(engine="ddp", lora_dropout=0.1, compile_model=True), v),
        # LoRA targets written for a Llama, on Phi-3's fused projections.
        (Scenario(family="phi3", gradient_checkpointing=False), v),
        # F11: the Trainer's own scheduler (none in the DeepSpeed config); F20: a config leaving out a shared value.
        (Scenario(trainer_loop="hf", zero_stage=2, gradient_checkpointing=False, deepspeed_scheduler=False), v),
        (
            Scenario(
                trainer_loop="hf",
                zero_stage=2,
                gradient_checkpointing=False,
                ds_config_omits=("gradient_accumulation_steps",),
            ),
            v,
        ),
        # F24-F32: each documented scenario where its failure occurs.
        (F24_SCENARIO, versions(torch="2.13.0")),
        (F25_SCENARIO, versions(trl="1.5.1")),
        (F26_SCENARIO, versions(deepspeed="0.18.3")),
        (F27_SCENARIO, versions(deepspeed="0.18.1")),
        (F28_SCENARIO, versions(accelerate="1.12.0")),
        (F29_SCENARIO, versions(peft="0.20.0")),
        (F30_SCENARIO, versions(peft="0.18.1", torchao="0.18.0")),
        (F31_SCENARIO, versions(trl="1.6.0")),
        (F32_SCENARIO, versions(transformers="5.0.0")),
        # F35: ZeRO-2 accumulating by hand (before 0.18.3: ZeRO-1 as well); F36: an 8-bit optimizer under ZeRO.
        (F35_SCENARIO, versions(deepspeed="0.18.0")),
        (Scenario(zero_stage=2, optimizer="adamw8bit", gradient_checkpointing=False), v),
        # F37: DeepSpeed's engine accumulating, on the releases whose output hooks scale per output.
        (Scenario(zero_stage=1, gradient_accumulation_steps=2, gradient_checkpointing=False), v),
    ]
    for rule in GUARDS.values():
        where = [(s, at) for s, at in candidates if rule.applies(s, at)]
        assert where, f"{rule.id} applies in none of the scenarios"
        scenario, at = where[0]
        assert rule.reason(at)
        assert not rule.applies(apply_guards(scenario, [Guard(rule.id, "")]), at), rule.id


def test_ddp_unused_parameter_search_under_reentrant_checkpointing_gets_a_static_graph() -> None:
    v = versions(transformers="4.57.6")
    guards = choose_guards(F6_SCENARIO, v)
    # PEFT already made the embedding output require grad (checkpointing came first): no F5 guard.
    assert ids(guards) == ["use-cache-off", "ddp-static-graph"]
    effective = apply_guards(F6_SCENARIO, guards)
    assert effective.ddp_static_graph and effective.ddp_find_unused_parameters and effective.use_reentrant is None


def test_ddp_needs_no_f6_guard_where_checkpointing_is_non_reentrant_or_no_unused_search() -> None:
    assert ids(choose_guards(F6_SCENARIO, versions(transformers="5.0.0"))) == ["use-cache-off"]
    plain = Scenario(engine="ddp", use_reentrant=True, checkpointing_before_adapter=True)
    assert "ddp-static-graph" not in ids(choose_guards(plain, versions(transformers="4.57.6")))


def test_checkpointing_after_the_adapter_still_needs_input_grads() -> None:
    after = Scenario(engine="ddp", use_reentrant=None, ddp_find_unused_parameters=True)
    assert ids(choose_guards(after, versions(transformers="4.57.6"))) == [
        "use-cache-off",
        "ddp-static-graph",
        "input-require-grads",
    ]


def test_fsdp1_mixed_units_keep_their_original_parameters() -> None:
    v = versions(torch="2.13.0")
    guards = choose_guards(F8_SCENARIO, v)
    assert ids(guards) == ["fsdp1-use-orig-params"]
    assert apply_guards(F8_SCENARIO, guards).fsdp1_use_orig_params is True
    # PEFT's policy gives each LoRA layer a unit of its own: every unit is uniform already.
    peft_units = Scenario(engine="fsdp1", gradient_checkpointing=False, fsdp1_wrap="peft")
    assert choose_guards(peft_units, v) == []


def test_a_zero3_save_is_gathered_whoever_drives_the_loop() -> None:
    v = versions(deepspeed="0.19.8", transformers="4.57.6")
    for scenario in (F7_SCENARIO, F9_SCENARIO, Scenario(gradient_checkpointing=False, save_adapter=True)):
        guards = choose_guards(scenario, v)
        assert ids(guards) == ["zero3-gathered-save"]
        assert apply_guards(scenario, guards).save_method == "gathered"
    # ZeRO-2 keeps whole parameters on every rank: nothing to gather.
    assert choose_guards(Scenario(zero_stage=2, gradient_checkpointing=False, save_adapter=True), v) == []


@pytest.mark.parametrize(
    "transformers, guarded",
    [("4.42.4", False), ("4.43.0", True), ("4.43.3", True), ("4.43.4", False), ("5.23.0", False)],
)
def test_resize_under_zero_init_is_moved_before_partitioning_where_transformers_breaks_it(
    transformers: str, guarded: bool
) -> None:
    guards = choose_guards(F10_SCENARIO, versions(deepspeed="0.19.8", transformers=transformers))
    assert ("resize-before-zero3-init" in ids(guards)) is guarded
    assert apply_guards(F10_SCENARIO, guards).zero_init is not guarded


def test_modules_to_save_under_zero3_falls_back_to_zero2_on_deepspeed_before_0_19_3() -> None:
    old = choose_guards(F9_SCENARIO, versions(deepspeed="0.19.2", transformers="4.57.6"))
    # Under ZeRO-2 every parameter is whole on every rank: the gathered save is not needed either.
    assert ids(old) == ["zero2-for-modules-to-save", "say-skipped-steps"]
    assert apply_guards(F9_SCENARIO, old).zero_stage == 2
    new = choose_guards(F9_SCENARIO, versions(deepspeed="0.19.3", transformers="4.57.6"))
    assert ids(new) == ["zero3-wait-every-gather", "zero3-gathered-save", "say-skipped-steps"]


@pytest.mark.parametrize(
    "deepspeed, stage, guarded", [("0.18.0", 3, True), ("0.19.7", 3, True), ("0.19.8", 3, False), ("0.19.2", 2, False)]
)
def test_every_coalesced_gather_is_waited_on_where_deepspeed_waits_only_on_the_last(
    deepspeed: str, stage: int, guarded: bool
) -> None:
    scenario = Scenario(zero_stage=stage, gradient_checkpointing=False)
    guards = choose_guards(scenario, versions(deepspeed=deepspeed))
    assert ("zero3-wait-every-gather" in ids(guards)) is guarded
    assert apply_guards(scenario, guards).zero3_wait_every_gather is guarded


def test_the_gather_race_is_guarded_in_every_mode_on_a_cpu_but_in_its_own_repro() -> None:
    from repros.trainer.guards import hazard_guards

    scenario = Scenario(zero_stage=3, gradient_checkpointing=False)
    old = versions(deepspeed="0.19.2")
    assert ids(hazard_guards(scenario, "cpu", "F4", old)) == ["zero3-wait-every-gather"]
    assert hazard_guards(scenario, "cpu", "F17", old) == []  # F17 shows the race
    assert hazard_guards(scenario, "cuda", "F4", old) == []  # ordered on one stream: nothing to guard
    assert hazard_guards(scenario, "cpu", "F4", versions(deepspeed="0.19.8")) == []


@pytest.mark.parametrize(
    "deepspeed, sequential, guarded", [("0.19.6", True, True), ("0.19.7", True, False), ("0.19.2", False, False)]
)
def test_a_handle_waits_once_where_sequential_gathers_would_wait_it_again(
    deepspeed: str, sequential: bool, guarded: bool
) -> None:
    scenario = Scenario(zero_stage=3, gradient_checkpointing=False, zero3_allgather_sequential=sequential)
    guards = choose_guards(scenario, versions(deepspeed=deepspeed))
    assert ("zero3-gather-handles-wait-once" in ids(guards)) is guarded


F35_SCENARIO = Scenario(zero_stage=2, manual_accumulation=2)


@pytest.mark.parametrize("deepspeed", ["0.17.6", "0.18.0", "0.18.2"])
def test_zero2_accumulating_before_0_18_3_trains_as_zero1_with_the_boundary_said(deepspeed: str) -> None:
    # DeepSpeed#7718: ZeRO-2 kept only the last micro-batch there whatever the boundary said (F35's bisect).
    guards = choose_guards(F35_SCENARIO, versions(deepspeed=deepspeed))
    assert {"zero1-accumulation-before-0.18.3", "deepspeed-accumulation-boundary"} <= set(ids(guards))
    effective = apply_guards(F35_SCENARIO, guards)
    assert effective.zero_stage == 1 and effective.deepspeed_accumulation_boundary


@pytest.mark.parametrize("deepspeed", ["0.17.5", "0.18.3", "0.19.8"])
def test_zero2_accumulating_elsewhere_keeps_zero2_and_says_the_boundary(deepspeed: str) -> None:
    guards = choose_guards(F35_SCENARIO, versions(deepspeed=deepspeed))
    assert "zero1-accumulation-before-0.18.3" not in ids(guards)
    assert apply_guards(F35_SCENARIO, guards).zero_stage == 2


def test_zero2_accumulating_by_the_engine_before_0_18_3_trains_as_zero1() -> None:
    scenario = Scenario(zero_stage=2, gradient_accumulation_steps=2)
    guards = choose_guards(scenario, versions(deepspeed="0.18.0"))
    assert "zero1-accumulation-before-0.18.3" in ids(guards)
    assert "zero1-accumulation-before-0.18.3" not in ids(
        choose_guards(Scenario(zero_stage=2), versions(deepspeed="0.18.0"))
    )


@pytest.mark.parametrize(
    ("deepspeed", "guarded"),
    [("0.18.2", False), ("0.18.3", False), ("0.18.4", True), ("0.19.5", True), ("0.19.6", False)],
)
def test_the_engine_accumulating_on_releases_that_scale_per_output_divides_the_loss_by_hand(
    deepspeed: str, guarded: bool
) -> None:
    scenario = Scenario(zero_stage=1, gradient_accumulation_steps=2)
    guards = choose_guards(scenario, versions(deepspeed=deepspeed))
    assert ("deepspeed-scale-by-hand" in ids(guards)) is guarded
    assert apply_guards(scenario, guards).deepspeed_scale_by_hand is guarded
    # By hand (gradient_accumulation_steps 1) nothing is divided twice.
    assert "deepspeed-scale-by-hand" not in ids(choose_guards(Scenario(zero_stage=1), versions(deepspeed=deepspeed)))
