"""F29 - LoRA ``target_parameters`` (a mixture of experts' fused weights) under ZeRO-3: ``tuple index out of range``.

transformers 5 keeps each layer's experts in one module of fused 3D weights (Mixtral's
``mlp.experts.gate_up_proj`` ``[experts, 2 * intermediate, hidden]`` and ``down_proj``), which no LoRA
``target_modules`` can reach: PEFT's ``target_parameters`` puts LoRA on such parameters by name, each
wrapped by ``lora.ParamWrapper``. Its constructor reads the wrapped parameter's ``shape`` (``param.shape[1],
param.shape[0]``, or three dimensions for experts). A model loaded under ZeRO-3 with ``zero.Init``
(``TrainingArguments(deepspeed=...)`` or accelerate's ``zero3_init_flag``) is partitioned as it is built:
every parameter's ``shape`` is ``torch.Size([0])`` and the real one is ``ds_shape``, so ``get_peft_model``
raises ``IndexError: tuple index out of range`` before anything trains. PEFT already read ``ds_shape`` in
three other places; PR #3576 (0.21.0) reads it in ``ParamWrapper`` too. peft#2855 and #2916 reported it (on
ZeRO-3 with TRL's SFT); the FSDP form (peft#3080) is open and not reproduced here.

bug:   a tiny Mixtral (4 experts, the test model's widths) saved as a checkpoint and loaded under ZeRO-3's
       ``zero.Init`` (an ``HfDeepSpeedConfig`` alive), LoRA r=8 on q/v and ``target_parameters`` on
       ``mlp.experts.gate_up_proj`` and ``mlp.experts.down_proj``, float32, no checkpointing, the fixed
       trainer's own loop (the error comes at ``get_peft_model``).
fixed: the same through the fixed trainer's guards (``zero3-target-parameters-load-whole`` on peft < 0.21.0:
       the model loaded whole, the adapter attached, ``deepspeed.initialize`` partitioning it; each rank holds
       the whole model while it loads).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packaging.version import Version

from repros.catalog._stacks import CURRENT, PEFT_0_20_0, stack
from repros.runtime.context import RankContext
from repros.runtime.outcomes import Outcome
from repros.runtime.spec import Expectation, ReproSpec, Signature, Variant
from repros.trainer.guards import GuardRule, Versions
from repros.trainer.scenario import Scenario

#: Mixtral's fused expert weights in transformers 5 (the names ``target_parameters`` users write).
EXPERT_PARAMETERS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")

SCENARIO = Scenario(
    engine="deepspeed",
    zero_stage=3,
    zero_init=True,
    zero3_persistence_threshold=0,
    bf16=False,
    gradient_checkpointing=False,
    moe_experts=4,
    target_parameters=EXPERT_PARAMETERS,
    learning_rate=1e-3,
)


def _wraps_parameters_zero_init(facts: Mapping[str, Any]) -> bool:
    """the failing run put LoRA on parameters by name (target_parameters) of a model zero.Init partitioned"""
    return bool(facts.get("target_parameters")) and bool(facts.get("zero_init"))


_ESTABLISHED = (
    "python -m harness run --cells peft-0.20.0,current-new-paths --repros F29 (2026-11-27); python -m harness "
    "bisect --repro F29 --mode bug --package peft --good 0.21.0 --bad 0.20.0 --cell peft-0.20.0 -> first good: "
    "peft==0.21.0 (2 steps, 643 s)"
)

SPEC = ReproSpec(
    id="F29",
    title="LoRA target_parameters (MoE experts) under ZeRO-3 zero.Init: ParamWrapper reads an empty shape",
    upstream=(
        "huggingface/peft#2916",
        "huggingface/peft#2855",
        "huggingface/peft PR #3576 (fix: ParamWrapper reads ds_shape; 0.21.0)",
        "huggingface/peft#3080 (the FSDP form, open; not reproduced here)",
    ),
    signatures=(
        Signature(
            id="F29.param-wrapper-shape",
            exception="IndexError",
            pattern=r"^tuple index out of range$",
            description="PEFT's ParamWrapper reads shape[1]/shape[0] of a parameter ZeRO-3 partitioned as it loaded "
            "(its shape is [0]; the same wording on every backend: no collective is involved)",
            facts_checks=(_wraps_parameters_zero_init,),
        ),
    ),
    expectations=(
        Expectation(
            "bug",
            Outcome.REPRODUCED,
            {"peft": ">=0.17.0,<0.21.0"},
            established_by=_ESTABLISHED,
            under=(PEFT_0_20_0,),
            observed={"peft": ("0.20.0",)},
            established_on="cpu",
        ),
        # current-new-paths, and the bisect's good step (peft-0.20.0 with peft 0.21.0).
        Expectation(
            "bug",
            Outcome.NOT_REPRODUCED,
            {},
            established_by=_ESTABLISHED,
            under=(CURRENT, stack(peft="0.21.0")),
            established_on="cpu",
        ),
        Expectation("fixed", Outcome.PASS, {}, established_by=_ESTABLISHED),
    ),
    variants=(
        Variant(
            "no-zero-init",
            "the model loaded whole and partitioned by deepspeed.initialize (the guard alone, on any peft)",
            {"zero_init": False},
            claim="huggingface/peft#2916 (loading without zero3_init_flag trains)",
        ),
    ),
    depends_on=("torch", "deepspeed", "peft", "transformers", "accelerate"),
    depends_on_why=(
        "peft's ParamWrapper reads the shape of transformers' fused expert weights that DeepSpeed partitioned as it "
        "loaded (zero.Init, arranged through transformers' integration, which reads accelerate), on torch; the "
        "repro drives the engine itself, and nothing is quantized"
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
#: PEFT PR #3576 (0.21.0): LoRA's ``ParamWrapper`` (``target_parameters``) reads a ZeRO-3 partitioned parameter's
#: shape from ``ds_shape``. Bisected by F29 (repros/catalog/f29_zero3_target_parameters_shape.py).
PEFT_PARAM_WRAPPER_DS_SHAPE = Version("0.21.0")


def _zero3_param_wrapper_empty_shape(s: Scenario, v: Versions) -> bool:
    peft = v.get("peft")
    return (
        s.engine == "deepspeed"
        and s.zero_stage == 3
        and s.zero_init
        and bool(s.target_parameters)
        and peft is not None
        and peft < PEFT_PARAM_WRAPPER_DS_SHAPE
    )


GUARD = GuardRule(
    "zero3-target-parameters-load-whole",
    "F29",
    _zero3_param_wrapper_empty_shape,
    {"zero_init": False},
    lambda v: (
        f"peft {v.get('peft')} < {PEFT_PARAM_WRAPPER_DS_SHAPE} reads a ZeRO-3 partitioned parameter's shape "
        "(empty) when it wraps it for target_parameters ('tuple index out of range', F29, PEFT PR #3576): load "
        "the model whole, attach the adapter, and let deepspeed.initialize partition it"
    ),
    explained=(
        "PEFT before 0.21.0 reads ``param.shape`` when LoRA's ``ParamWrapper`` wraps a parameter named in "
        "``target_parameters`` (a mixture of experts' fused expert weights); a model ZeRO-3 partitioned as it "
        "loaded (``zero.Init``) has an empty shape there (``IndexError: tuple index out of range``, F29, "
        "peft#2916, PEFT PR #3576): load the model whole, attach the adapter, and let ``deepspeed.initialize`` "
        "partition it (each rank holds the whole model while it loads)."
    ),
)
