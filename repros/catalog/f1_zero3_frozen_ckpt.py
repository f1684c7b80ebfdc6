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

from repros.catalog._stacks import CURRENT, TF4
from repros.catalog._surveyed import surveyed
from repros.runtime.context import RankContext
from repros.runtime.outcomes import Outcome
from repros.runtime.signatures import CHECKPOINT_ERROR, RECOMPUTE_METADATA_PATTERN, recomputed_shapes_are_empty
from repros.runtime.spec import Expectation, ReproSpec, Signature, Variant
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
