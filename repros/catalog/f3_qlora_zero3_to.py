"""F3 - QLoRA (bitsandbytes) under DeepSpeed ZeRO-3: transformers refuses the engine's ``.to``.

DeepSpeed's engine moves the module it is given with ``self.module.to(self.device)``.
When that module is the raw transformers model (the adapter added with the model's own
``add_adapter``, not wrapped in a ``PeftModel``), ``PreTrainedModel.to`` refuses to move a
bitsandbytes-quantized model: ``ValueError: `.to` is not supported for `4-bit` or `8-bit`
bitsandbytes models...`` in transformers before 4.45; afterwards the 4-bit case was allowed
(transformers PR #33122, with bitsandbytes >= 0.43.2) and the 8-bit case kept its own
message (``.to` is not supported for `8-bit` bitsandbytes models``) through transformers
4.x; transformers 5 allows it with bitsandbytes >= 0.48 and otherwise says "You need to
install `pip install bitsandbytes>=0.48.0` if you want to move a 8-bit model across devices
using to()" from the same call.

bug:   tiny Qwen2 loaded 8-bit (``int8``) through ``BitsAndBytesConfig``, LoRA r=8 on q/v
       added with ``model.add_adapter``, no gradient checkpointing (it would bring in F1 on a
       DeepSpeed without PR #8148), the raw HF model to ``deepspeed.initialize`` (ZeRO-3, every
       parameter partitioned, bf16, a torch AdamW client optimizer).
fixed: the same scenario through the fixed trainer's guards (``peft-model-wrap``: a
       ``PeftModel``, whose ``.to`` is torch's own).

On CUDA the ranks run the QLoRA form users run and the threads report: 4-bit (``nf4``), which
bitsandbytes quantizes on a GPU and transformers refused to move before 4.45 (``F3.to-4bit-or-8bit``,
then ``F3.to-4bit`` with bitsandbytes < 0.43.2). The expectations below were established on a CPU
with the 8-bit form; the 4-bit form has none yet, so a GPU runner's bug outcome is a finding (as F19's
is on torch releases no GPU has run).

A cell whose bitsandbytes or transformers cannot quantize on this device at all gives
``INFRA`` with the library's own reason (see repros/trainer/quantized.py); a cell without
bitsandbytes, INFRA saying so (repros/trainer/fixed_trainer.py: ``require_packages``).
"""

from __future__ import annotations

from dataclasses import replace

from repros.catalog._stacks import CURRENT, DS_0_19_2, TF4, TF4_DS_0_18, stack
from repros.runtime.context import RankContext
from repros.runtime.outcomes import Outcome
from repros.runtime.spec import Expectation, ReproSpec, Signature, Variant
from repros.trainer.guards import GuardRule
from repros.trainer.scenario import Scenario

#: The quantization the bug mode uses on a CPU (decided by running; see the module docstring).
BUG_QUANTIZATION = "int8"
#: ... and where the ranks have CUDA: QLoRA's own 4-bit form.
CUDA_QUANTIZATION = "nf4"

# Established by running both modes per cell (2026-11-23, torch 2.13.0+cpu, 2 ranks, gloo,
# peft 0.21.2, accelerate 1.15.0; deepspeed 0.19.8 unless named):
#   transformers 4.57.6 + bitsandbytes 0.50.2: bug REPRODUCED (F3.to-8bit), fixed PASS
#   transformers 4.57.6 + bitsandbytes 0.46.1: bug REPRODUCED (F3.to-8bit), fixed FAIL (see below)
#   transformers 4.57.6 + bitsandbytes 0.45.5: bug INFRA, fixed INFRA ("CUDA is required but not
#     available for bitsandbytes...": no CPU backend before 0.46)
#   transformers 5.23.0 + bitsandbytes 0.50.2, deepspeed 0.19.8 and 0.19.2: bug NOT_REPRODUCED, fixed PASS
#   transformers 5.23.0 + bitsandbytes 0.47.0: bug REPRODUCED (F3.to-8bit-needs-bnb-0.48)
# bitsandbytes 0.46.x int8 on CPU computes Linear8bitLt outputs ~2000x too large (no error;
# 0.47.0 is right), so attention saturates, q_proj's adapters get zero gradients and the loss
# stays flat: the fixed trainer cannot train there (measured, a bitsandbytes bug, not F3).
_ESTABLISHED = (
    "python -m harness run --matrix M --repros F3, M = matrix.yaml's defaults with cells "
    "transformers==4.57.6 x bitsandbytes==0.45.5 / 0.46.1 / 0.50.2, transformers==5.23.0 x "
    "deepspeed==0.19.2 / 0.19.8, transformers==5.23.0 x bitsandbytes==0.47.0 "
    "(2026-11-23, torch 2.13.0+cpu, 2 ranks, gloo)"
)
_CPU_NOTE = "on CPU; bitsandbytes < 0.46 has no CPU backend (on a GPU runner this cell can run)"

#: The documented configuration (the ``bug`` mode; ``fixed`` runs it through the guards).
SCENARIO = Scenario(
    engine="deepspeed",
    zero_stage=3,
    # Persistence threshold 0: ZeRO-3 partitions every parameter, as it does the large
    # (quantized) weights of a real model. Its default (1e5 elements) would keep all of
    # this tiny model's weights whole, and DeepSpeed 0.19.2 all-gathers persistent
    # parameters into one buffer dtype after each step, which gloo refuses for int8
    # weights next to bf16 ones ("ProcessGroupGloo::allgather: invalid tensor type") -
    # an artifact of the tiny model, not F3.
    zero3_persistence_threshold=0,
    bf16=True,
    peft_wrapping="add_adapter",
    quantization=BUG_QUANTIZATION,
    # Off: F3 happens in deepspeed.initialize, before any forward; with checkpointing
    # on, a DeepSpeed without PR #8148 would fail with F1 instead where F3 is fixed.
    gradient_checkpointing=False,
)

SPEC = ReproSpec(
    id="F3",
    title="QLoRA (bitsandbytes) + ZeRO-3: transformers refuses the engine's .to",
    upstream=(
        "OpenRLHF/OpenRLHF#295",
        "OpenRLHF/OpenRLHF#403",
        "OpenRLHF/OpenRLHF#1150",
        "huggingface/transformers#29303",
        "huggingface/transformers PR #33122 (4-bit .to allowed)",
    ),
    signatures=(
        Signature(
            id="F3.to-4bit-or-8bit",
            exception="ValueError",
            pattern=r"`\.to` is not supported for `4-bit` or `8-bit` bitsandbytes models\.",
            description="transformers < 4.45: the one message for 4-bit and 8-bit models",
        ),
        Signature(
            id="F3.to-8bit",
            exception="ValueError",
            pattern=r"`\.to` is not supported for `8-bit` bitsandbytes models\.",
            description="transformers 4.45 .. 4.x: the 8-bit form kept after PR #33122",
        ),
        Signature(
            id="F3.to-4bit",
            exception="ValueError",
            pattern=r"Calling `to\(\)` is not supported for `4-bit` quantized models",
            description="transformers 4.45 .. 4.x with bitsandbytes < 0.43.2: the newer 4-bit wording",
        ),
        Signature(
            id="F3.to-8bit-needs-bnb-0.48",
            exception="ValueError",
            pattern=r"if you want to move a 8-bit model across devices using to\(\)",
            description="transformers 5: the 8-bit guard kept for bitsandbytes < 0.48, same engine .to call",
        ),
    ),
    expectations=(
        Expectation(
            "bug",
            Outcome.INFRA,
            {"bitsandbytes": "<0.46"},
            established_by=_ESTABLISHED,
            note=_CPU_NOTE,
            device="cpu",
            under=(TF4,),
            observed={"bitsandbytes": ("0.45.5",)},
        ),
        Expectation(
            "bug",
            Outcome.REPRODUCED,
            {"transformers": "<5.0.0.dev0"},
            established_by=_ESTABLISHED,
            device="cpu",
            under=(TF4, TF4_DS_0_18, stack(transformers="4.57.6", bitsandbytes="0.46.1")),
            observed={"transformers": ("4.57.6",)},
        ),
        Expectation(
            "bug",
            Outcome.REPRODUCED,
            {"transformers": ">=5.0.0.dev0", "bitsandbytes": "<0.48"},
            established_by=_ESTABLISHED,
            note="transformers 5's wording: F3.to-8bit-needs-bnb-0.48",
            device="cpu",
            under=(CURRENT,),
            observed={"transformers": ("5.23.0",), "bitsandbytes": ("0.47.0",)},
        ),
        Expectation(
            "bug",
            Outcome.NOT_REPRODUCED,
            {"transformers": ">=5.0.0.dev0", "bitsandbytes": ">=0.48"},
            established_by=_ESTABLISHED,
            note="transformers 5 lets an 8-bit model move with to() given bitsandbytes >= 0.48",
            device="cpu",
            under=(CURRENT, DS_0_19_2),
            observed={"transformers": ("5.23.0",), "bitsandbytes": ("0.50.2",)},
        ),
        Expectation(
            "fixed", Outcome.INFRA, {"bitsandbytes": "<0.46"}, established_by=_ESTABLISHED, note=_CPU_NOTE, device="cpu"
        ),
        Expectation(
            "fixed",
            Outcome.FAIL,
            {"bitsandbytes": ">=0.46,<0.47"},
            established_by=_ESTABLISHED,
            note="bitsandbytes 0.46.x int8 CPU matmul gives wrong outputs; no trainer can train there",
            device="cpu",
        ),
        Expectation("fixed", Outcome.PASS, {}, established_by=_ESTABLISHED),
    ),
    depends_on=("torch", "deepspeed", "peft", "transformers", "bitsandbytes"),
    depends_on_why=(
        "DeepSpeed's engine moves the bitsandbytes-quantized transformers model with to(), which transformers "
        "refuses; peft adds the adapter, torch runs it; the fixed trainer drives the engine itself, so accelerate "
        "takes no part"
    ),
    description=__doc__ or "",
    variants=(
        Variant(
            "zero2",
            "ZeRO-2 instead of ZeRO-3 (the advice in the threads)",
            {"zero_stage": 2},
            claim="OpenRLHF#295, #403: use ZeRO-2 for QLoRA",
        ),
    ),
)


def scenario_on(device_type: str) -> Scenario:
    """The documented configuration on this device: 8-bit on a CPU, QLoRA's 4-bit where there is CUDA."""
    return replace(SCENARIO, quantization=CUDA_QUANTIZATION) if device_type == "cuda" else SCENARIO


def run(ctx: RankContext) -> None:
    from repros.trainer.fixed_trainer import train
    from repros.trainer.quantized import last_load_facts
    from repros.trainer.variants import scenario_for

    documented = scenario_on(ctx.device_type)
    scenario, guards = scenario_for(ctx, SPEC, documented)
    ctx.facts["f3_quantization"] = documented.quantization
    try:
        train(scenario, ctx, guards)
    finally:
        ctx.facts["quantized_load"] = last_load_facts()


# The fixed trainer's workaround of this failure: chosen by repros/trainer/guards.py (in its order), listed in
# docs/guards.md.
GUARD = GuardRule(
    "peft-model-wrap",
    "F3",
    lambda s, v: bool(s.quantization) and s.peft_wrapping != "peft_model",
    {"peft_wrapping": "peft_model"},
    lambda v: "engines call .to on a raw HF model, which transformers refuses when quantized (F3)",
    explained=(
        "a quantized HF model with an adapter added by ``add_adapter`` goes to the engine as a raw HF model, "
        "whose ``.to`` transformers refuses (F3); wrap it in a ``PeftModel`` instead."
    ),
)
