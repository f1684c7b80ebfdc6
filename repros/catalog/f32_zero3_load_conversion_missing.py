"""F32 - transformers 5 loading a published MoE checkpoint under ZeRO-3: the weights stay random (``MISSING``).

transformers 5 changed how many models hold their weights (a mixture of experts' layer keeps its experts in
fused 3D tensors) and converts a checkpoint written in the published layout as it loads (renamings and merges
from ``conversion_mapping``: Mixtral's ``block_sparse_moe.experts.E.w1/w3`` merged into
``mlp.experts.gate_up_proj``). A model built under ZeRO-3's ``zero.Init`` is loaded by another path,
``_load_state_dict_into_zero3_model``, which in transformers 5.0.0 does not load a checkpoint whose model has a
conversion mapping as it should: measured here, the load report lists every parameter but the fused experts
``MISSING`` (the attention, the router, the embeddings and the head), 12 of the tiny Mixtral's 21 parameters
stay at their random initialization (its 5 norms are ones either way), and training starts from there without an
error (a real model's loss near 30: transformers#43940, DeepSpeed#7848; TRL's Qwen3-MoE, transformers#43257). A
dense Qwen2 checkpoint, which needs no conversion, loads whole under ``zero.Init`` on 5.0.0 (measured). PR
#43303 (5.1.0) passes the conversion to that path, but its helper unpacks the converter's result as ``(tensors,
errors)`` while the converter returns the tensors alone: 5.1.x raises ``RuntimeError: Failed to apply weight
conversion ... not enough values to unpack``; PR #43964 (5.2.0) fixes that. Later reports of the same symptom on
multimodal models (Qwen3.5, transformers#45313; Gemma 4, #45397: their language and vision towers' renamings)
are model-specific and need those models, which the tiny families here are not.

Observed here, silently: the loaded model is compared with the same checkpoint loaded whole, outside ZeRO-3
(``repros/trainer/moe_checkpoint.py``), and any difference is ``LoadedNotCheckpoint``.

bug:   a tiny Mixtral (4 experts) written in the published per-expert layout, loaded under ZeRO-3's
       ``zero.Init`` (an ``HfDeepSpeedConfig`` alive), LoRA r=8 on q/v, float32, the fixed trainer's own loop.
fixed: the same through the fixed trainer's guards (``zero3-load-whole-then-partition`` on transformers 5.0 ..
       5.1.x: loaded whole, converted, then partitioned by ``deepspeed.initialize``; each rank holds the whole
       model while it loads).
"""

from __future__ import annotations

from packaging.version import Version

from repros.catalog._stacks import CURRENT, TF_5_0_0, TF_5_1_0, stack
from repros.runtime.context import RankContext
from repros.runtime.outcomes import Outcome
from repros.runtime.spec import Expectation, ReproSpec, Signature, Variant
from repros.trainer.guards import GuardRule, Versions
from repros.trainer.scenario import Scenario

SCENARIO = Scenario(
    engine="deepspeed",
    zero_stage=3,
    zero_init=True,
    zero3_persistence_threshold=0,
    bf16=False,
    gradient_checkpointing=False,
    moe_experts=4,
    moe_checkpoint_per_expert=True,
    learning_rate=1e-3,
)

_ESTABLISHED = (
    "python -m harness run --cells tf-5.0.0,tf-5.1.0,current-new-paths --repros F32 (2026-11-27); python -m harness "
    "bisect --repro F32 --mode bug --package transformers --good 5.2.0 --bad 5.1.0 --cell tf-5.1.0 -> first good: "
    "transformers==5.2.0 (2 steps, 276 s)"
)

SPEC = ReproSpec(
    id="F32",
    title="transformers 5 loading a published MoE checkpoint under ZeRO-3 zero.Init: weights left random (MISSING)",
    upstream=(
        "huggingface/transformers#43940",
        "deepspeedai/DeepSpeed#7848",
        "huggingface/transformers#43257",
        "huggingface/transformers PR #43303 (5.1.0: the conversion passed to the ZeRO-3 load)",
        "huggingface/transformers PR #43964 (fix: the converter's return shape; 5.2.0)",
        "huggingface/transformers#45313, #45397 (the same symptom on Qwen3.5 and Gemma 4: not reproduced here)",
    ),
    signatures=(
        Signature(
            id="F32.loaded-not-checkpoint",
            exception="repros.trainer.silent_failures.LoadedNotCheckpoint",
            pattern=r"^loaded weights are not the checkpoint's: \d+ of \d+ parameters differ",
            description="no error: the ZeRO-3 load skipped the checkpoint's conversion and left the weights at their "
            "random initialization (transformers' load report: MISSING)",
        ),
        Signature(
            id="F32.conversion-unpack",
            exception="RuntimeError",
            pattern=r"Failed to apply weight conversion for '[^']*'.*not enough values to unpack",
            description="the ZeRO-3 load's conversion helper unpacks the converter's result as (tensors, errors) "
            "(transformers 5.1.x, PR #43303 before #43964)",
        ),
    ),
    expectations=(
        Expectation(
            "bug",
            Outcome.REPRODUCED,
            {"transformers": ">=5.0.0,<5.2.0"},
            established_by=_ESTABLISHED,
            under=(TF_5_0_0, TF_5_1_0),
            observed={"transformers": ("5.0.0", "5.1.0")},
            established_on="cpu",
        ),
        # current-new-paths, and the bisect's good step (tf-5.1.0 with transformers 5.2.0).
        Expectation(
            "bug",
            Outcome.NOT_REPRODUCED,
            {},
            established_by=_ESTABLISHED,
            under=(CURRENT, stack(transformers="5.2.0")),
            established_on="cpu",
        ),
        Expectation("fixed", Outcome.PASS, {}, established_by=_ESTABLISHED),
    ),
    variants=(
        Variant(
            "no-zero-init",
            "the model loaded whole and partitioned by deepspeed.initialize (the guard alone, on any transformers)",
            {"zero_init": False},
            claim="transformers#43940 (ZeRO-2, or loading without zero.Init, loads the weights)",
        ),
    ),
    depends_on=("torch", "deepspeed", "transformers", "accelerate"),
    depends_on_why=(
        "transformers' ZeRO-3 load (under zero.Init, arranged through its integration, which reads accelerate) "
        "fills the parameters DeepSpeed partitioned, on torch; the load is checked before peft adds the adapter, so "
        "peft takes no part, and nothing is quantized"
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
#: transformers 5.0.0 loads a checkpoint that needs its weight conversion (a published MoE's per-expert layout)
#: into a ZeRO-3 partitioned model without converting it (PR #43303, 5.1.0, converts; its helper broke on the
#: converter's return shape until PR #43964, 5.2.0). Bisected by F32
#: (repros/catalog/f32_zero3_load_conversion_missing.py).
TRANSFORMERS_Z3_CONVERSION_BROKEN = (Version("5.0.0.dev0"), Version("5.2.0"))


def _zero3_load_skips_conversion(s: Scenario, v: Versions) -> bool:
    transformers = v.get("transformers")
    low, high = TRANSFORMERS_Z3_CONVERSION_BROKEN
    return (
        s.engine == "deepspeed"
        and s.zero_stage == 3
        and s.zero_init
        and s.moe_checkpoint_per_expert
        and transformers is not None
        and low <= transformers < high
    )


GUARD = GuardRule(
    "zero3-load-whole-then-partition",
    "F32",
    _zero3_load_skips_conversion,
    {"zero_init": False},
    lambda v: (
        f"transformers {v.get('transformers')} (>= 5.0, < {TRANSFORMERS_Z3_CONVERSION_BROKEN[1]}) loads a "
        "checkpoint that needs its weight conversion (a published MoE's per-expert layout) into a zero.Init "
        "model unconverted: the weights stay random (MISSING) or the conversion raises (F32, transformers "
        "PR #43303, #43964): load it whole, converted, and let deepspeed.initialize partition it"
    ),
    explained=(
        "transformers 5.0.0 .. 5.1.x load a checkpoint that needs transformers 5's weight conversion (a published "
        "Mixtral's per-expert layout) into a ``zero.Init`` model without converting it: 5.0.0 leaves every weight "
        'at its random initialization (``MISSING`` rows in the load report, no error), 5.1.x raises "Failed to '
        'apply weight conversion" (F32, transformers#43940, PRs #43303 and #43964): load it whole (converted), '
        "and let ``deepspeed.initialize`` partition it (each rank holds the whole model while it loads)."
    ),
)
