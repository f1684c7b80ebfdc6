"""F9 - ``modules_to_save`` under ZeRO-3: the saved copies are empty (peft 0.15.0).

With ``modules_to_save`` PEFT trains full copies of some modules (here the embedding and the LM
head) beside the LoRA layers and saves them with the adapter. Under ZeRO-3 ``Trainer.save_model``
(with ``stage3_gather_16bit_weights_on_model_save``, the documented way) hands PEFT a state dict
gathered from every rank. peft 0.15.0 took the ``modules_to_save`` weights from the module's own
parameters instead (``adapter_state_dict``), which ZeRO-3 has partitioned to ``torch.Size([0])``:
the LoRA tensors are saved right, the copies empty, nothing raises, and loading or merging the
adapter later fails with ``size mismatch for ...modules_to_save.default.weight: copying a param
with shape torch.Size([0])``. peft PR #2456 (0.15.1) slices the state dict it is handed again: a
one-release regression.

bug:   tiny Qwen2, LoRA r=8 on q/v with ``modules_to_save=["embed_tokens", "lm_head"]``, trained by
       transformers' ``Trainer`` with ``TrainingArguments(deepspeed=...)`` (ZeRO-3, every parameter
       partitioned, ``stage3_gather_16bit_weights_on_model_save: true``, float32, on a CPU
       ``use_cpu=True``), ``trainer.save_model(dir)``, then the adapter loaded into a fresh base
       model (``PeftModel.from_pretrained``) and compared by its logits with the trained model.
fixed: the same scenario through the fixed trainer's guards (``zero3-gathered-save``: the save
       runs inside ``GatheredParameters``, so the module's own parameters are whole; on deepspeed
       < 0.19.3 ``zero2-for-modules-to-save`` instead, see below).

On deepspeed 0.18.0 and 0.19.2 the first backward fails before anything is saved:
``AttributeError: 'Linear' object has no attribute 'ds_grads_remaining'`` (F13, DeepSpeed#7615,
from 0.16.5 on; 0.19.3 trains), with or without ``zero.Init``: ZeRO-3 cannot train
``modules_to_save`` there at all, so the bug mode is a ``DIFFERENT_ERROR`` (F13's signature) and the
fixed trainer trains under ZeRO-2.

Float32: under bf16, DeepSpeed 0.19.x leaves a model built inside ``zero.Init`` in its loaded
dtype for the LoRA weights created afterwards (float32) while the ``modules_to_save`` copies are
bfloat16, and ZeRO-3's ``defragment`` asserts one dtype (a bare ``AssertionError``): another
failure, which stops training before F9 can show.
"""

from __future__ import annotations

import re

from repros.catalog._stacks import CURRENT, DS_0_19_2, TF4, TF4_DS_0_18, TF4_PEFT_0_15_0
from repros.runtime.context import RankContext
from repros.runtime.outcomes import Outcome
from repros.runtime.spec import Expectation, ReproSpec, Signature

_MISMATCH = re.compile(
    r"size mismatch for (?P<name>\S+): copying a param with shape (?P<shape>torch\.Size\(\[[^\]]*\]\))"
)

# Established by running (2026-11-23, torch 2.13.0+cpu, 2 ranks, gloo): peft 0.15.0 with transformers
# 4.57.6 and deepspeed 0.19.8 REPRODUCED (the LoRA tensors saved whole, embed_tokens and lm_head copies
# torch.Size([0])); peft 0.21.2 (transformers 4.57.6 and 5.23.0), 0.15.1 and 0.14.0 NOT_REPRODUCED; the
# harness's bisect named 0.15.0 from both sides. deepspeed 0.18.0 and 0.19.2: DIFFERENT_ERROR (DeepSpeed#7615),
# 0.19.3 and 0.19.5 NOT_REPRODUCED. fixed PASS in every one of these cells (ZeRO-2 on deepspeed < 0.19.3).
_ESTABLISHED = (
    "python -m harness run --matrix M --repros F9, M = matrix.yaml's defaults with cells current, "
    "transformers==4.57.6 x peft==0.15.0 / 0.15.1 / 0.21.2, deepspeed==0.19.2 / 0.19.3 / 0.19.5, transformers==4.57.6 "
    "+ deepspeed==0.18.0 (2026-11-23); then python -m harness bisect --repro F9 --mode bug --package peft --good "
    "0.15.1 --bad 0.15.0 --cell tf4-peft-0.15.0 -> first good: peft==0.15.1 (2 steps, 96 s), and --good 0.14.0 "
    "--bad 0.15.0 -> first bad: peft==0.15.0 (2 steps, 135 s)"
)


def only_modules_to_save_came_back_empty(message: str) -> bool:
    """Every tensor the load refuses is a ``modules_to_save`` copy saved as ``torch.Size([0])``: the
    LoRA tensors were saved whole (else it is F7's empty save of everything)."""
    found = [(m.group("name"), m.group("shape")) for m in _MISMATCH.finditer(message)]
    return bool(found) and all(".modules_to_save." in name and shape == "torch.Size([0])" for name, shape in found)


SPEC = ReproSpec(
    id="F9",
    title="modules_to_save under ZeRO-3: the saved copies are empty (peft 0.15.0)",
    upstream=(
        "huggingface/peft#2450",
        "huggingface/peft PR #2456 (fix, 0.15.1)",
        "huggingface/peft PR #1450 (an older ZeRO-3 + zero.Init modules_to_save crash in training, not this one)",
        "deepspeedai/DeepSpeed#7615 (ZeRO-3 cannot train modules_to_save on 0.16.5 .. 0.19.2: F13, a near-miss)",
    ),
    signatures=(
        Signature(
            id="F9.modules-to-save-shape-0",
            exception="RuntimeError",
            pattern=r"size mismatch for \S*\.modules_to_save\.\S+: copying a param with shape torch\.Size\(\[0\]\)",
            checks=(only_modules_to_save_came_back_empty,),
            description="loading the saved adapter: only the modules_to_save copies were saved as torch.Size([0])",
        ),
    ),
    expectations=(
        Expectation(
            "bug",
            Outcome.DIFFERENT_ERROR,
            {"deepspeed": "<0.19.3"},
            established_by=_ESTABLISHED,
            note="F13 first (DeepSpeed#7615): ZeRO-3 cannot train modules_to_save on these releases "
            "('Linear' object has no attribute 'ds_grads_remaining'), so nothing is saved",
            under=(DS_0_19_2, TF4_DS_0_18),
            observed={"deepspeed": ("0.18.0", "0.19.2")},
            established_on="cpu",
        ),
        Expectation(
            "bug",
            Outcome.REPRODUCED,
            {"peft": "==0.15.0"},
            established_by=_ESTABLISHED,
            under=(TF4_PEFT_0_15_0,),
            observed={"peft": ("0.15.0",)},
            established_on="cpu",
        ),
        Expectation(
            "bug",
            Outcome.NOT_REPRODUCED,
            {"peft": "!=0.15.0"},
            established_by=_ESTABLISHED,
            under=(CURRENT, TF4),
            observed={"peft": ("0.14.0", "0.15.1", "0.21.2")},
            established_on="cpu",
        ),
        Expectation("fixed", Outcome.PASS, {}, established_by=_ESTABLISHED),
    ),
    depends_on=("torch", "deepspeed", "peft", "transformers", "accelerate"),
    depends_on_why=(
        "transformers' Trainer (through accelerate) saves peft's modules_to_save from a ZeRO-3 (deepspeed) engine on "
        "torch; nothing is quantized"
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
        zero3_persistence_threshold=0,
        zero3_gather_16bit_on_save=True,
        bf16=False,
        gradient_checkpointing=False,
        modules_to_save=("embed_tokens", "lm_head"),
        trainer_loop="hf",
        # Loaded after TrainingArguments(deepspeed=...), as users do: inside zero.Init.
        zero_init=True,
        save_adapter=True,
    )
    scenario, guards = scenario_for(ctx, SPEC, scenario)
    train(scenario, ctx, guards)
