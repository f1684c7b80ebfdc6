"""F7 - ZeRO-3 + LoRA saves an empty adapter, silently.

Under ZeRO-3 each rank holds only a shard of every parameter, the adapters included. transformers
4.x's ``Trainer.save_model`` asks DeepSpeed for a consolidated state dict, which it refuses
without ``stage3_gather_16bit_weights_on_model_save``; the Trainer then logs a warning, writes the
adapter from an empty state dict (``adapter_model.safetensors`` of 40 bytes, no tensors), removes
only the full model's weight files and saves a ZeRO checkpoint instead. Nothing raises, and
nothing raises when the adapter is loaded later either: PEFT warns about missing adapter keys and
the "trained" model is the untrained base. transformers PR #41416 (5.0.0) gathers the adapter
itself. Saving with PEFT's ``save_pretrained`` on rank 0 outside the Trainer writes the shards
instead (tensors of ``torch.Size([0])``), and loading that raises ``size mismatch ... copying a
param with shape torch.Size([0])``: the same failure, louder.

bug:   tiny Qwen2, LoRA r=8 on q/v by ``get_peft_model``, trained by transformers' ``Trainer`` with
       ``TrainingArguments(deepspeed=...)`` (ZeRO-3, every parameter partitioned, bf16, a DeepSpeed
       WarmupLR as in HF's DeepSpeed guide, no ``stage3_gather_16bit_weights_on_model_save``; on a
       CPU ``use_cpu=True``), then ``trainer.save_model(dir)``; then the adapter is loaded into a
       fresh base model with ``PeftModel.from_pretrained`` and its logits are compared with the
       trained model's (``ReloadedAdapterDiffers`` when they differ).
fixed: the same scenario through the fixed trainer's guards (``zero3-gathered-save``).

A CPU run must pass ``use_cpu=True``: without it accelerate gives each rank a world of its own
while DeepSpeed's is 2, and on transformers 5 both ranks then save as the main process, rank 1's
shards last: a ``[0]``-shaped adapter on the fixed release, which would be taken for F7.
"""

from __future__ import annotations

from repros.catalog._stacks import CURRENT, DS_0_19_2, TF4, TF4_DS_0_18, stack
from repros.catalog._surveyed import TRANSFORMERS_5, surveyed
from repros.runtime.context import RankContext
from repros.runtime.outcomes import Outcome
from repros.runtime.spec import Expectation, ReproSpec, Signature
from repros.trainer.guards import GuardRule

_SHAPE_0 = r"size mismatch for \S*lora_\S+: copying a param with shape torch\.Size\(\[0\]\) from checkpoint"

# Established by running (2026-11-23, torch 2.13.0+cpu, peft 0.21.2, 2 ranks, gloo): transformers 4.57.6
# REPRODUCED with deepspeed 0.19.8 and 0.18.0 (a 40-byte adapter_model.safetensors with no tensors; reloaded,
# max |logit difference| 0 to the untrained base and 0.61 to the trained model); transformers 5.23.0
# NOT_REPRODUCED with deepspeed 0.19.8, 0.19.2, 0.19.3, 0.19.5; fixed PASS in all; then bisect put the
# boundary at 5.0.0 (PR #41416).
_ESTABLISHED = (
    "python -m harness run --matrix M --repros F7, M = matrix.yaml's defaults with cells current, "
    "transformers==4.57.6, transformers==4.57.6 + deepspeed==0.18.0, deepspeed==0.19.2 / 0.19.3 / 0.19.5 "
    "(2026-11-23); then python -m harness bisect --repro F7 --mode bug --package transformers --good 5.23.0 "
    "--bad 4.57.6 --cell tf4 -> first good: transformers==5.0.0 (7 steps, 732 s: 4.57.6 REPRODUCED; 5.0.0, "
    "5.1.0, 5.4.0, 5.5.4, 5.11.0, 5.23.0 NOT_REPRODUCED)"
)

DEPENDS_ON = ("torch", "deepspeed", "peft", "transformers", "accelerate")

SPEC = ReproSpec(
    id="F7",
    title="ZeRO-3 + LoRA saves an empty adapter, silently",
    upstream=(
        "huggingface/trl#4416",
        "huggingface/peft#2892",
        "deepspeedai/DeepSpeed#7900",
        "huggingface/peft#453",
        "huggingface/accelerate#3508",
        "hiyouga/LlamaFactory#572",
        "huggingface/transformers PR #41416 (fix: Trainer.save_model gathers a PEFT adapter under ZeRO-3)",
    ),
    signatures=(
        Signature(
            id="F7.reloaded-adapter-differs",
            exception="repros.trainer.silent_failures.ReloadedAdapterDiffers",
            # Its name before the worker side was split (logs of earlier harness versions).
            aliases=("repros.common.silent_failures.ReloadedAdapterDiffers",),
            pattern=r"^reloaded adapter differs from the trained one",
            description="no error at save or load, but the saved adapter, loaded into a fresh base model, does "
            "not give the trained model's logits",
        ),
        Signature(
            id="F7.size-mismatch-shape-0",
            exception="RuntimeError",
            pattern=_SHAPE_0,
            description="loading an adapter saved from ZeRO-3 shards: LoRA tensors of torch.Size([0])",
        ),
    ),
    expectations=(
        # The surveyed stacks first: a run of one of them is compared with what was seen there.
        # The surveyed stacks with transformers 5 have none of it.
        *surveyed(DEPENDS_ON, otherwise=dict.fromkeys(TRANSFORMERS_5, Outcome.NOT_REPRODUCED)),
        Expectation(
            "bug",
            Outcome.REPRODUCED,
            {"transformers": "<5.0.0.dev0"},
            established_by=_ESTABLISHED,
            under=(TF4, TF4_DS_0_18),
            observed={"transformers": ("4.57.6",)},
            established_on="cpu",
        ),
        Expectation(
            "bug",
            Outcome.NOT_REPRODUCED,
            {"transformers": ">=5.0.0.dev0"},
            established_by=_ESTABLISHED,
            under=(CURRENT, DS_0_19_2, stack(deepspeed="0.19.3"), stack(deepspeed="0.19.5")),
            observed={"transformers": ("5.0.0", "5.1.0", "5.4.0", "5.5.4", "5.11.0", "5.23.0")},
            established_on="cpu",
        ),
        Expectation("fixed", Outcome.PASS, {}, established_by=_ESTABLISHED),
    ),
    depends_on=DEPENDS_ON,
    depends_on_why=(
        "transformers' Trainer (through accelerate) saves peft's adapter from a ZeRO-3 (deepspeed) engine on torch; "
        "nothing is quantized"
    ),
    description=__doc__ or "",
)


def run(ctx: RankContext) -> None:
    from repros.trainer.fixed_trainer import train
    from repros.trainer.scenario import Scenario
    from repros.trainer.variants import scenario_for

    scenario = Scenario(
        engine="deepspeed",
        zero_stage=3,
        # Every parameter partitioned, as the large ones of a real model are (the default, 1e5
        # elements, would keep all of this tiny model's whole).
        zero3_persistence_threshold=0,
        bf16=True,
        gradient_checkpointing=False,
        trainer_loop="hf",
        # Loaded after TrainingArguments(deepspeed=...), as users do: inside zero.Init.
        zero_init=True,
        save_adapter=True,
    )
    scenario, guards = scenario_for(ctx, SPEC, scenario)
    train(scenario, ctx, guards)


# The fixed trainer's workaround of this failure: chosen by repros/trainer/guards.py (in its order), listed in
# docs/guards.md.
GUARD = GuardRule(
    "zero3-gathered-save",
    "F7",
    lambda s, v: s.save_adapter and s.engine == "deepspeed" and s.zero_stage == 3 and s.save_method != "gathered",
    {"save_method": "gathered"},
    lambda v: (
        "a ZeRO-3 save that does not gather the parameters writes empty or [0]-shaped adapters (F7; "
        "peft 0.15.0's modules_to_save, F9)"
    ),
    also_works_around=("F9",),
    explained=(
        "under ZeRO-3 every rank holds a shard of each parameter; a save that does not gather them writes an "
        "empty adapter (transformers < 5's ``Trainer.save_model`` without "
        "``stage3_gather_16bit_weights_on_model_save``) or ``[0]``-shaped tensors (``save_pretrained`` on rank 0) "
        "(F7), and peft 0.15.0 reads ``modules_to_save`` from the module itself even when handed a gathered state "
        "dict (F9); save inside ``deepspeed.zero.GatheredParameters`` of the trainable parameters instead."
    ),
)
