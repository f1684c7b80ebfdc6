"""F1 - LoRA + gradient checkpointing + DeepSpeed ZeRO-3: recomputed shapes ``[0]``.

ZeRO-3's forward post-hook re-partitions each parameter in place during the
non-reentrant recompute. Since torch stopped detaching saved tensors that do not
require grad (pytorch PR #127959), the frozen base weights are held by live
reference and have shrunk to ``[0]`` when torch compares the recompute's metadata.
Trainable LoRA weights are unaffected. DeepSpeed PR #8148 fixed it.

The tensors that shrink are frozen parameters autograd saved as themselves: the RMSNorm weights of a
Qwen2, Llama, Mistral, Phi-3 or Qwen2-MoE layer (``weight * hidden``; a Linear saves its weight's
transpose, a view that keeps its shape). Gemma-2 saves none: its RMSNorm multiplies by ``1 + weight``
computed in float32, a new tensor, so F1 cannot occur in it (``impossible_in``; ds-0.19.2@gemma2 trains,
and the same model with a Llama-style norm reproduces F1).

bug:   tiny Qwen2, LoRA r=8 on q/v, bf16, ZeRO-3, HF gradient checkpointing with
       ``use_reentrant=False``, a torch AdamW as the client optimizer.
fixed: the same scenario through the fixed trainer's guards.
"""

from __future__ import annotations

from packaging.version import Version

from repros.catalog._stacks import CURRENT, TF4
from repros.catalog._surveyed import surveyed
from repros.runtime.context import RankContext
from repros.runtime.outcomes import Outcome
from repros.runtime.signatures import CHECKPOINT_ERROR, RECOMPUTE_METADATA_PATTERN, recomputed_shapes_are_empty
from repros.runtime.spec import Diverges, Expectation, ReproSpec, Signature, Variant
from repros.trainer.guards import GuardRule, Versions, checkpoints_reentrantly
from repros.trainer.scenario import Scenario

# The boundary, found by running the bug mode in one cell per DeepSpeed release from
# 0.19.2 to 0.19.8 (torch 2.13.0 CPU, peft 0.21.2, transformers 5.23.0): 0.19.2
# REPRODUCED, 0.19.3 to 0.19.8 NOT_REPRODUCED. So PR #8148 first shipped in 0.19.3.
_ESTABLISHED = (
    "python -m harness run --matrix M --lane ci --repros F1 --modes bug, M = matrix.yaml's defaults with cells "
    "deepspeed==0.19.2 ... ==0.19.8 (2026-11-22, torch 2.13.0+cpu, 2 ranks, gloo)"
)

#: The documented configuration (the ``bug`` mode; ``fixed`` runs it through the guards).
SCENARIO = Scenario(zero_stage=3, bf16=True, gradient_checkpointing=True, use_reentrant=False)

DEPENDS_ON = ("torch", "deepspeed", "peft", "transformers")

SPEC = ReproSpec(
    id="F1",
    title="LoRA + gradient checkpointing + ZeRO-3: recomputed shape [0]",
    upstream=(
        "OpenRLHF#569",
        "OpenBMB/MiniCPM-V#651",
        "huggingface/trl#2514",
        "huggingface/transformers#47254",
        "deepspeedai/DeepSpeed PR #8148 (fix)",
    ),
    signatures=(
        Signature(
            id="F1.recompute-shape-0",
            exception=CHECKPOINT_ERROR,
            pattern=RECOMPUTE_METADATA_PATTERN,
            checks=(recomputed_shapes_are_empty,),
            description="CheckpointError listing tensors saved non-empty and recomputed as torch.Size([0]), "
            "dtype and device unchanged",
        ),
    ),
    expectations=(
        # The surveyed stacks first: a run of one of them is compared with what was seen there.
        *surveyed(
            DEPENDS_ON,
            otherwise={
                "openrlhf-v0.4.0": Outcome.NOT_REPRODUCED,
                "newest-2026-07": Outcome.NOT_REPRODUCED,
                "openrlhf-v0.11.0": Outcome.NOT_REPRODUCED,
                "newest-2026-08": Outcome.NOT_REPRODUCED,
            },
        ),
        Expectation(
            "bug",
            Outcome.REPRODUCED,
            {"deepspeed": "<0.19.3"},
            established_by=_ESTABLISHED,
            under=(CURRENT, TF4),
            observed={"deepspeed": ("0.19.2",)},
            established_on="cpu",
        ),
        Expectation(
            "bug",
            Outcome.NOT_REPRODUCED,
            {"deepspeed": ">=0.19.3"},
            established_by=_ESTABLISHED,
            under=(CURRENT, TF4),
            observed={"deepspeed": ("0.19.3", "0.19.8")},
            established_on="cpu",
        ),
        Expectation("fixed", Outcome.PASS, {}, established_by=_ESTABLISHED),
    ),
    depends_on=DEPENDS_ON,
    depends_on_why=(
        "ZeRO-3 (deepspeed) re-partitions the frozen weights of a LoRA of peft's while torch recomputes transformers' "
        "non-reentrant checkpoint; the fixed trainer drives the engine itself, so accelerate takes no part, and "
        "nothing is quantized"
    ),
    description=__doc__ or "",
    # A ZeRO-3 strategy checkpointing non-reentrantly recomputes the frozen weights as [0] where its bug mode does.
    diverges=(
        Diverges(
            ("zero3-*-ckpt-nr*",),
            {"deepspeed": "<0.19.3"},
            "python -m harness crosscheck --cells tf4-ds-0.18.0,tf4-ds-0.17.6 --strategies <the 42 of the ci lane, "
            "the pairwise cover and nine with AdamW> (2026-11-29, torch 2.13.0+cpu, transformers 4.57.6, 2 ranks, "
            "gloo): zero3-bf16-ckpt-nr-accum-engine raised F1's CheckpointError with deepspeed 0.18.0; with "
            "0.19.8 every ZeRO-3 strategy agrees",
        ),
    ),
    impossible_in={
        "gemma2": "Gemma-2's layers save no frozen parameter as itself for backward (its RMSNorm multiplies by "
        "1 + weight computed in float32, a new tensor; a Linear saves its weight's transpose), so nothing "
        "ZeRO-3 re-partitions during the recompute is compared: with a Llama-style norm (weight * x) the same "
        "model reproduces F1 in ds-0.19.2",
    },
    variants=(
        Variant("zero2", "ZeRO-2 instead of ZeRO-3", {"zero_stage": 2}, claim="OpenRLHF#569, trl#2514"),
        Variant(
            "reentrant",
            "reentrant checkpointing (use_reentrant=True)",
            {"use_reentrant": True},
            claim="OpenRLHF#569, MiniCPM-V#651",
        ),
        Variant(
            "no-checkpointing", "gradient checkpointing off", {"gradient_checkpointing": False}, claim="OpenRLHF#569"
        ),
        Variant(
            "small-sub-group",
            "ZeRO-3 sub_group_size 1e5 (DeepSpeed's advice to lower ZeRO-3 memory)",
            {"zero3_sub_group_size": 100_000},
            claim="DeepSpeed ZeRO-3 configuration docs",
        ),
    ),
)


def run(ctx: RankContext) -> None:
    from repros.trainer.fixed_trainer import train_deepspeed
    from repros.trainer.variants import scenario_for

    scenario, guards = scenario_for(ctx, SPEC, SCENARIO)
    train_deepspeed(scenario, ctx, guards)


# The fixed trainer's workaround of this failure: chosen by repros/trainer/guards.py (in its order), listed in
# docs/guards.md.
#: First DeepSpeed release with PR #8148 ("Z3: Support for activation ckpt with
#: frozen params"). Established by running F1 (see repros/catalog/f1_zero3_frozen_ckpt.py).
DEEPSPEED_Z3_FROZEN_CKPT_FIX = Version("0.19.3")


def _zero3_frozen_ckpt_affected(s: Scenario, v: Versions) -> bool:
    deepspeed = v.get("deepspeed")
    return (
        s.engine == "deepspeed"
        and s.zero_stage == 3
        and s.gradient_checkpointing
        and not checkpoints_reentrantly(s, v)
        and deepspeed is not None
        and deepspeed < DEEPSPEED_Z3_FROZEN_CKPT_FIX
    )


GUARD = GuardRule(
    "zero3-reentrant-checkpointing",
    "F1",
    _zero3_frozen_ckpt_affected,
    {"use_reentrant": True},
    lambda v: (
        f"deepspeed {v.get('deepspeed')} < {DEEPSPEED_Z3_FROZEN_CKPT_FIX} re-partitions frozen weights "
        "during non-reentrant recompute (F1, DeepSpeed PR #8148)"
    ),
    explained=(
        "ZeRO-3 with frozen base weights and non-reentrant checkpointing on a DeepSpeed without PR #8148 "
        "re-partitions frozen weights to ``[0]`` before torch checks the recompute (F1); checkpoint reentrantly "
        "instead."
    ),
)
