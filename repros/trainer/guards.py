"""The fixed trainer's workarounds, as one table: each guard's id, when it applies, what it
changes in the scenario, and why.

Each documented failure's guard is declared beside the failure, as its catalog module's ``GUARD``
(with the version constants it tests); the hygiene guards are declared here. ``GUARDS`` holds them
all in the order they are chosen: ``choose_guards`` walks it over the scenario as the guards before
it left it (so ``input-require-grads`` sees the reentrant checkpointing
``zero3-reentrant-checkpointing`` switched on) and the installed versions; ``apply_guards`` applies
the chosen ones. Every guard's reference text is its ``explained``; ``docs/guards.md`` lists them
(``python -m harness catalog --write`` renders it, ``--check`` fails when it is stale).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from importlib import metadata
from typing import Any

from packaging.version import InvalidVersion, Version

from repros.runtime.registry import Registry, lazy
from repros.trainer.scenario import Scenario

#: transformers 5 made non-reentrant checkpointing the default (4.x checkpointed reentrantly).
TRANSFORMERS_NON_REENTRANT_DEFAULT = Version("5.0.0.dev0")

#: Installed versions the guards look at: package name -> version (None: not installed).
Versions = Mapping[str, Version | None]
GUARDED_PACKAGES = ("deepspeed", "transformers", "torch", "peft", "bitsandbytes", "accelerate", "torchao", "trl")


@dataclass(frozen=True)
class Guard:
    """A guard as applied: its id and why it applied here."""

    id: str
    reason: str


@dataclass(frozen=True)
class GuardRule:
    """One workaround of the fixed trainer: its id, the documented failure it works around, when
    it applies (the scenario and the installed versions), the scenario fields it sets, and why."""

    id: str
    #: The documented failure it works around (a repro id), or "" for hygiene and for a failure no
    #: repro documents yet (its reason names the upstream report).
    works_around: str
    applies: Callable[[Scenario, Versions], bool]
    #: Scenario fields it sets.
    effect: Mapping[str, Any]
    reason: Callable[[Versions], str]
    #: A hazard of the machine the harness runs on rather than of the scenario (F17's gather race,
    #: on gloo only): guarded in every mode on a CPU, so that a ``bug`` run shows the repro's own
    #: failure and not this one, except in the repro that documents it (``hazard_guards``).
    every_mode: bool = False
    #: Other documented failures the same change works around (``family-target-modules``: F23's too).
    also_works_around: tuple[str, ...] = ()
    #: The reference text (``docs/guards.md``): what goes wrong, on which releases, and what the guard changes.
    explained: str = ""

    def works_around_failure(self, repro_id: str) -> bool:
        return repro_id == self.works_around or repro_id in self.also_works_around


def installed_versions(packages: tuple[str, ...] = GUARDED_PACKAGES) -> dict[str, Version | None]:
    found: dict[str, Version | None] = {}
    for name in packages:
        try:
            found[name] = Version(metadata.version(name))
        except (metadata.PackageNotFoundError, InvalidVersion):
            found[name] = None
    return found


def checkpoints_reentrantly(scenario: Scenario, versions: Versions | None = None) -> bool:
    """Whether the scenario's checkpointing is reentrant, the library default resolved."""
    if not scenario.gradient_checkpointing:
        return False
    if scenario.use_reentrant is not None:
        return scenario.use_reentrant
    transformers = (versions if versions is not None else installed_versions()).get("transformers")
    return transformers is None or transformers < TRANSFORMERS_NON_REENTRANT_DEFAULT


USE_CACHE_OFF = GuardRule(
    "use-cache-off",
    "",
    lambda s, v: s.gradient_checkpointing and s.use_cache is not False,
    {"use_cache": False},
    lambda v: "KV cache is useless and harmful under gradient checkpointing",
    explained=("under gradient checkpointing, ``config.use_cache = False``."),
)

BNB_CPU_NO_REPACK = GuardRule(
    "bnb-cpu-no-repack",
    "",
    lambda s, v: s.quantization == "nf4" and not s.bnb_no_repack,
    {"bnb_no_repack": True},
    lambda v: "bitsandbytes' CPU repacking of 4-bit weights corrupts dequantize/merge",
    explained=(
        "bitsandbytes on an AVX512-BF16 CPU repacks 4-bit weights in place after an eval-mode forward, after "
        "which dequantize/merge return wrong weights; turn the repacking off on every ``Linear4bit``."
    ),
)

#: Every guard, by id, in the order they are chosen (one guard's effect can make a later one apply): the
#: hygiene guards here, each failure's workaround as the ``GUARD`` of its catalog module, imported when the table is
#: read (``repros/runtime/registry.py``). A new guard is its failure's ``GUARD`` and one line here.
GUARDS: Registry[GuardRule] = Registry(
    "guard of the fixed trainer",
    {
        "use-cache-off": USE_CACHE_OFF,
        "zero3-reentrant-checkpointing": lazy("repros.catalog.f1_zero3_frozen_ckpt:GUARD"),
        "ddp-static-graph": lazy("repros.catalog.f6_ddp_reentrant_ready_twice:GUARD"),
        "input-require-grads": lazy("repros.catalog.f5_reentrant_frozen_base:GUARD"),
        "fsdp1-use-orig-params": lazy("repros.catalog.f8_fsdp1_uniform_requires_grad:GUARD"),
        "fsdp-uniform-dtypes": lazy("repros.catalog.f2_dora_fsdp_ckpt_dtype:GUARD"),
        "fsdp2-broadcast-rank0-weights": lazy("repros.catalog.f15_fsdp_ram_efficient_loading_nan:GUARD"),
        "fsdp2-adapter-full-state-dict": lazy("repros.catalog.f16_fsdp2_adapter_only_rank0_shard:GUARD"),
        "peft-model-wrap": lazy("repros.catalog.f3_qlora_zero3_to:GUARD"),
        "lora-dropout-off-under-compile": lazy("repros.catalog.f19_lora_ckpt_compile_dropout:GUARD"),
        "bnb-4bit-storage-compute-dtype": lazy("repros.catalog.f14_fsdp2_qlora_uint8_storage:GUARD"),
        "peft-torchao-dispatch-checked": lazy("repros.catalog.f30_peft_torchao_import:GUARD"),
        "bnb-4bit-uint8-storage-fsdp2": lazy("repros.catalog.f24_fsdp2_nf4_bf16_nan_canonical:GUARD"),
        "liger-loss-off-under-zero3": lazy("repros.catalog.f25_zero3_liger_lm_head_shard:GUARD"),
        "accelerate-cp-context": lazy("repros.catalog.f28_fsdp2_context_parallel_skipped:GUARD"),
        "trl-nll-under-fsdp2-peft": lazy("repros.catalog.f31_fsdp2_peft_chunked_nll_dtensor:GUARD"),
        "bnb-cpu-no-repack": BNB_CPU_NO_REPACK,
        "resize-before-zero3-init": lazy("repros.catalog.f10_resize_embeddings_zero3:GUARD"),
        "zero2-for-modules-to-save": lazy("repros.catalog.f13_zero3_modules_to_save_ds_grads_remaining:GUARD"),
        "zero3-adapters-in-base-dtype": lazy("repros.catalog.f12_zero3_mixed_dtype_gather:GUARD"),
        "zero3-target-parameters-load-whole": lazy("repros.catalog.f29_zero3_target_parameters_shape:GUARD"),
        "zero3-load-whole-then-partition": lazy("repros.catalog.f32_zero3_load_conversion_missing:GUARD"),
        "ulysses-register-base-model": lazy("repros.catalog.f26_ulysses_peft_register:GUARD"),
        "ulysses-zero1-not-zero0": lazy("repros.catalog.f27_ulysses_zero0_mpu:GUARD"),
        "zero3-moe-leaf-modules": lazy("repros.catalog.f21_zero3_moe_routing_hang:GUARD"),
        "family-target-modules": lazy("repros.catalog.f33_phi3_llama_target_names:GUARD"),
        "zero3-wait-every-gather": lazy("repros.catalog.f17_zero3_gloo_gather_race:GUARD"),
        "zero3-no-shared-rotary-fn": lazy("repros.catalog.f18_zero3_trl_rotary_fn_deque:GUARD"),
        "zero3-gather-handles-wait-once": lazy("repros.catalog.f22_zero3_sequential_handle_rewait:GUARD"),
        "zero3-gathered-save": lazy("repros.catalog.f7_zero3_empty_adapter_save:GUARD"),
        "drop-empty-param-groups": lazy("repros.catalog.f11_trainer_scheduler_param_groups:GUARD"),
        "ds-config-auto": lazy("repros.catalog.f20_deepspeed_config_disagrees:GUARD"),
        "say-skipped-steps": lazy("repros.catalog.f34_zero_bf16_silent_skipped_step:GUARD"),
        "zero1-accumulation-before-0.18.3": lazy(
            "repros.catalog.f35_zero2_manual_accumulation_last_only:GUARD_BEFORE_0_18_3"
        ),
        "deepspeed-accumulation-boundary": lazy("repros.catalog.f35_zero2_manual_accumulation_last_only:GUARD"),
        "deepspeed-scale-by-hand": lazy("repros.catalog.f37_deepspeed_gas_scaled_per_output:GUARD"),
        "fp32-state-under-sharding": lazy("repros.catalog.f36_8bit_state_by_shard_size:GUARD"),
        "merge-before-sync": lazy("repros.catalog.f4_lora_weight_sync:GUARD"),
    },
)


def choose_guards(scenario: Scenario, versions: Versions | None = None) -> list[Guard]:
    """The guards that apply to ``scenario`` with ``versions`` (default: what is installed)."""
    versions = versions if versions is not None else installed_versions()
    chosen: list[Guard] = []
    current = scenario
    for rule in GUARDS.values():
        if rule.applies(current, versions):
            chosen.append(Guard(rule.id, rule.reason(versions)))
            current = replace(current, **rule.effect)
    return chosen


def hazard_guards(
    scenario: Scenario, device_type: str, documented: str, versions: Versions | None = None
) -> list[Guard]:
    """The guards a run as users wrote it still gets: those of the CPU machine's own hazards
    (``every_mode``), on a CPU, except for the repro ``documented`` that is about that hazard."""
    if device_type != "cpu":
        return []
    versions = versions if versions is not None else installed_versions()
    return [
        Guard(rule.id, rule.reason(versions))
        for rule in GUARDS.values()
        if rule.every_mode and rule.works_around != documented and rule.applies(scenario, versions)
    ]


def apply_guards(scenario: Scenario, guards: list[Guard]) -> Scenario:
    changes: dict[str, Any] = {}
    for guard in guards:
        changes.update(GUARDS[guard.id].effect)
    return replace(scenario, **changes)
