"""F12 - ZeRO-3 + LoRA under bf16 with zero.Init: the gather after the optimizer step refuses mixed dtypes (0.19.2).

ZeRO-3 keeps parameters below ``stage3_param_persistence_threshold`` whole on every rank and, after
each optimizer step, all-gathers them again from their updated partitions (``_post_step``:
``persistent_parameters[0].all_gather(...)``, ``Init._allgather_params_coalesced``). That function
allocated every output buffer in the dtype of the first parameter of the list. Until 0.19.1 the
engine cast the whole module to bf16 (``module.bfloat16()``), so the list was of one dtype. DeepSpeed
PR #8066 (0.19.2) stopped casting a model ZeRO-3 partitioned as it loaded (``zero.Init``, what
``from_pretrained`` does under ``TrainingArguments(deepspeed=...)`` or an ``HfDeepSpeedConfig``): its
base stays bf16 while PEFT's adapters, made after loading, stay float32 (``get_peft_model``'s default
``autocast_adapter_dtype=True``). The first optimizer step's gather then hands a float32 buffer a
bf16 partition, or the reverse: NCCL raises ``TypeError: output tensor must have the same type as
input tensor``, gloo ``RuntimeError: ProcessGroupGloo::allgather: invalid tensor type at index 0
(expected TensorOptions(dtype=float, ...), got TensorOptions(dtype=c10::BFloat16, ...))``. DeepSpeed
PR #8073 (0.19.3) allocates each buffer in its own parameter's dtype.

bug:   tiny Qwen2 loaded with ``from_pretrained`` while an ``HfDeepSpeedConfig`` (ZeRO-3, bf16) is
       alive (so inside ``zero.Init``), LoRA r=8 on q/v by ``get_peft_model`` (PEFT's defaults),
       ZeRO-3 with its default persistence threshold (a tiny model's parameters all persistent, as a
       real model's norms, biases and LoRA matrices are), the fixed trainer's own loop.
fixed: the same scenario through the fixed trainer's guards (``zero3-adapters-in-base-dtype`` on
       deepspeed 0.19.2: ``get_peft_model(..., autocast_adapter_dtype=False)``, as TRL PR #6091 does,
       so the adapters are bf16 like the base, as 0.19.1's cast made them).

Not the older "output tensor must have the same type as input tensor" reports with QLoRA (a
quantized base gathered with bf16 modules, DeepSpeed#5049) or with fp16/bf16 configs that disagree
(LLaVA#949): the signature wants a bf16 run, no quantization, and the model loaded inside zero.Init.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from packaging.version import Version

from repros.catalog._stacks import CURRENT
from repros.runtime.context import RankContext
from repros.runtime.outcomes import Outcome
from repros.runtime.spec import Expectation, ReproSpec, Signature, Variant, WorldSizes
from repros.trainer.guards import GuardRule, Versions
from repros.trainer.scenario import Scenario

SCENARIO = Scenario(
    engine="deepspeed",
    zero_stage=3,
    bf16=True,
    gradient_checkpointing=False,
    # from_pretrained while an HfDeepSpeedConfig is alive: inside zero.Init, as Trainer users load.
    zero_init=True,
)

_GLOO_DTYPES = re.compile(
    r"invalid tensor type at index \d+ \(expected TensorOptions\(dtype=(?P<expected>[\w:]+),.*?"
    r"got TensorOptions\(dtype=(?P<got>[\w:]+),",
    re.DOTALL,
)
_HALF = ("c10::BFloat16", "c10::Half", "BFloat16", "Half")

# Established by running (2026-11-26, torch 2.13.0+cpu, peft 0.21.2, 2 ranks, gloo): bug REPRODUCED on
# deepspeed 0.19.2 (transformers 5.23.0), NOT_REPRODUCED on 0.18.0 (transformers 4.57.6 and 5.23.0), 0.18.6,
# 0.18.9, 0.19.0, 0.19.1, 0.19.3 and 0.19.8; fixed PASS everywhere run; then the harness's bisect from both sides
# (its first try at 0.19.1 lost the environment being built, "build.log" gone: rerun over 0.19.0 .. 0.19.2).
_ESTABLISHED = (
    "python -m harness run --cells ds-0.19.2,current,ds-0.19.3,tf4-ds-0.18.0,tf4-ds-0.17.6 --repros F12,F13,F21 "
    "--jobs 1 (2026-11-26); python -m harness bisect --repro F12 --mode bug --package deepspeed --good 0.18.0 "
    "--bad 0.19.2 --cell ds-0.19.2 -> 0.18.6, 0.18.9, 0.19.0 NOT_REPRODUCED, 0.19.1 no environment; --good 0.19.0 "
    "--bad 0.19.2 -> first bad: deepspeed==0.19.2 (3 steps, 582 s: 0.19.0 and 0.19.1 NOT_REPRODUCED, 0.19.2 "
    "REPRODUCED); --good 0.19.3 --bad 0.19.2 -> first good: "
    "deepspeed==0.19.3 (2 steps, 85 s)"
)


def float32_against_16_bit(message: str) -> bool:
    """gloo names both dtypes: one float32 (the adapters), the other 16-bit (the base), either way."""
    found = _GLOO_DTYPES.search(message)
    if found is None:
        return False
    pair = {found["expected"], found["got"]}
    return "float" in pair and bool(pair & set(_HALF))


def zero_init_bf16_without_quantization(facts: Mapping[str, Any]) -> bool:
    """A DeepSpeed bf16 run of an unquantized model loaded inside zero.Init (not QLoRA's quantized base)."""
    return (
        facts.get("engine") == "deepspeed"
        and not facts.get("quantization")
        and bool(facts.get("zero_init"))
        and facts.get("bf16") is not False
    )


SPEC = ReproSpec(
    id="F12",
    title="ZeRO-3 + LoRA, bf16, zero.Init: the gather after the optimizer step refuses mixed dtypes (0.19.2)",
    upstream=(
        "deepspeedai/DeepSpeed#8072",
        "deepspeedai/DeepSpeed PR #8073 (fix: a buffer per parameter's dtype; 0.19.3)",
        "deepspeedai/DeepSpeed PR #8066 (0.19.2: a zero.Init model no longer cast to bf16)",
        "huggingface/trl#6089 / PR #6091 (autocast_adapter_dtype=False under ZeRO-3)",
    ),
    signatures=(
        Signature(
            id="F12.gloo-invalid-tensor-type",
            exception="RuntimeError",
            pattern=r"ProcessGroupGloo::allgather: invalid tensor type at index \d+",
            checks=(float32_against_16_bit,),
            description="gloo: an all-gather's output and input tensors, one float32 and one bf16/fp16",
        ),
        Signature(
            id="F12.output-tensor-type",
            exception="TypeError",
            aliases=("RuntimeError",),
            pattern=r"^output tensor must have the same type as input tensor",
            facts_checks=(zero_init_bf16_without_quantization,),
            description="NCCL: an all-gather's output and input tensors of different dtypes, in a bf16 run of an "
            "unquantized model loaded inside zero.Init",
        ),
    ),
    expectations=(
        Expectation(
            "bug",
            Outcome.REPRODUCED,
            {"deepspeed": "==0.19.2"},
            established_by=_ESTABLISHED,
            under=(CURRENT,),
            observed={"deepspeed": ("0.19.2",)},
            established_on="cpu",
        ),
        Expectation(
            "bug",
            Outcome.NOT_REPRODUCED,
            {"deepspeed": "!=0.19.2"},
            established_by=_ESTABLISHED,
            under=(CURRENT,),
            observed={"deepspeed": ("0.18.0", "0.18.6", "0.18.9", "0.19.0", "0.19.1", "0.19.3", "0.19.8")},
            established_on="cpu",
        ),
        Expectation("fixed", Outcome.PASS, {}, established_by=_ESTABLISHED),
    ),
    variants=(
        Variant(
            "adapters-bf16",
            "the adapters made in the base model's dtype (get_peft_model(..., autocast_adapter_dtype=False)): the "
            "fixed trainer's guard alone, priced where the gather is fixed",
            {"peft_autocast_adapter_dtype": False},
            claim="huggingface/trl PR #6091",
        ),
        Variant(
            "no-zero-init",
            "the model loaded whole, outside zero.Init (accelerate's zero3_init_flag: false), then partitioned by "
            "deepspeed.initialize",
            {"zero_init": False},
            claim="what users without zero.Init do; DeepSpeed 0.19.2 still casts such a model to bf16",
        ),
    ),
    world_sizes=WorldSizes(2),
    world_sizes_why=(
        "with one rank ZeRO-3 has one partition and never all-gathers (DeepSpeed's `num_partitions == 1` "
        "path, `_no_gather_coalesced`), so no gather meets the mixed dtypes (ds-0.19.2 at world size 1: "
        "NOT_REPRODUCED, on a CPU and on an H200)"
    ),
    depends_on=("torch", "deepspeed", "peft", "transformers"),
    depends_on_why=(
        "ZeRO-3 (deepspeed) gathers the persistent parameters of a model transformers loaded under zero.Init, peft's "
        "float32 adapters among them, through torch's collectives; the fixed trainer drives the engine itself, so "
        "accelerate takes no part, and nothing is quantized"
    ),
    description=__doc__ or "",
)


def run(ctx: RankContext) -> None:
    from repros.trainer.fixed_trainer import train
    from repros.trainer.variants import scenario_for

    scenario, guards = scenario_for(ctx, SPEC, SCENARIO)
    train(scenario, ctx, guards)


# The fixed trainer's workaround of this failure: chosen by repros/trainer/guards.py (in its order), listed in
# docs/guards.md.
#: DeepSpeed releases whose ZeRO-3 coalesced gather allocates every output in the first parameter's
#: dtype while a zero.Init model keeps its float32 adapters (PR #8066 .. PR #8073). Bisected by F12
#: (repros/catalog/f12_zero3_mixed_dtype_gather.py).
DEEPSPEED_Z3_MIXED_DTYPE_GATHER_BROKEN = (Version("0.19.2"), Version("0.19.3"))

#: The first peft with ``get_peft_model(..., autocast_adapter_dtype=...)``.
PEFT_AUTOCAST_ADAPTER_DTYPE = Version("0.12.0")


def _zero3_mixed_dtype_gather(s: Scenario, v: Versions) -> bool:
    deepspeed, peft = v.get("deepspeed"), v.get("peft")
    low, high = DEEPSPEED_Z3_MIXED_DTYPE_GATHER_BROKEN
    return (
        s.engine == "deepspeed"
        and s.zero_stage == 3
        and s.bf16
        and s.zero_init
        and s.lora_impl == "peft"
        and s.peft_wrapping == "peft_model"
        and not s.quantization
        and s.peft_autocast_adapter_dtype
        and deepspeed is not None
        and low <= deepspeed < high
        and peft is not None
        and peft >= PEFT_AUTOCAST_ADAPTER_DTYPE
    )


GUARD = GuardRule(
    "zero3-adapters-in-base-dtype",
    "F12",
    _zero3_mixed_dtype_gather,
    {"peft_autocast_adapter_dtype": False},
    lambda v: (
        f"deepspeed {v.get('deepspeed')} gathers ZeRO-3 persistent parameters into buffers of the first one's "
        "dtype, and keeps a zero.Init model's float32 adapters beside its bf16 base (F12, DeepSpeed#8072)"
    ),
    explained=(
        "DeepSpeed 0.19.2 no longer casts a model ZeRO-3 partitioned as it loaded (``zero.Init``) to bf16, so "
        "PEFT's float32 adapters sit beside the bf16 base among the persistent parameters, and the coalesced "
        "all-gather after the optimizer step allocates every output in the first one's dtype (F12, "
        "DeepSpeed#8072, fixed by PR #8073 in 0.19.3): create the adapters in the base model's dtype "
        "(``get_peft_model(..., autocast_adapter_dtype=False)``, TRL PR #6091)."
    ),
)
