"""F2 - DoRA + FSDP mixed precision + gradient checkpointing: float32/bfloat16 recompute mismatch.

FSDP2 casts a module's forward inputs to its mixed-precision ``param_dtype`` in the forward
pre-hook. The non-reentrant recompute runs the module again from the backward pre-hook
path, which on torch without PR #182580 ("[FSDP] Cast forward inputs during AC recompute")
does not cast: a float32 tensor entering a checkpointed bf16 layer is recomputed in another
dtype than it was saved in, and torch's recompute check raises. DoRA's dtype-sensitive
forward (the weight norm) is where the users met it.

transformers 5.23 moved its checkpointing from a layer's ``__call__`` to its ``forward``,
which keeps the FSDP2 hooks out of the recompute: the natural trigger needs torch < 2.13
and transformers < 5.23 together.

bug:   tiny Qwen2, DoRA r=8 on q/v, FSDP2 ``fully_shard`` on each decoder layer under a bf16
       ``MixedPrecisionPolicy`` and on the root without one, autocast on, HF gradient
       checkpointing with ``use_reentrant=False``.
fixed: the same scenario through the fixed trainer's guards.
"""

from __future__ import annotations

from repros.catalog._stacks import CURRENT, TF4, TORCH_2_12_TF4
from repros.runtime.context import RankContext
from repros.runtime.outcomes import Outcome
from repros.runtime.signatures import (
    CHECKPOINT_ERROR,
    RECOMPUTE_METADATA_PATTERN,
    recomputed_dtype_float32_bfloat16,
)
from repros.runtime.spec import Expectation, ReproSpec, Signature, Variant
from repros.trainer.guards import GuardRule
from repros.trainer.scenario import Scenario

# Two boundaries, both established by running (2026-11-23, 2 ranks, gloo, CPU):
# - torch: torch 2.12.1 REPRODUCED, 2.13.0 NOT_REPRODUCED (transformers 4.57.6); 2.13.0's
#   FSDP2 ``_pre_forward`` casts inputs on the PRE_BACKWARD path, 2.12.1's returns early.
# - transformers: 5.23.0 checkpoints a layer's ``forward`` instead of ``__call__``, so FSDP2's
#   hooks stay outside the checkpoint and are not replayed; bisect with torch 2.12.1 found it.
_ESTABLISHED = (
    "python -m harness run --matrix M --repros F2, M = matrix.yaml's defaults with cells torch==2.12.1 + "
    "transformers==4.57.6, transformers==4.57.6, current; then python -m harness bisect --repro F2 --package "
    "transformers --good 5.23.0 --bad 4.57.6 --matrix M --cell torch-2.12-tf4 -> first good: transformers==5.23.0 "
    "(8 steps: 4.57.6, 5.11.0, 5.17.0, 5.20.2, 5.22.0, 5.22.1, 5.22.2 REPRODUCED; 5.23.0 NOT_REPRODUCED)"
)

#: The documented configuration (the ``bug`` mode; ``fixed`` runs it through the guards).
SCENARIO = Scenario(engine="fsdp2", adapter="dora", bf16=True, gradient_checkpointing=True, use_reentrant=False)

SPEC = ReproSpec(
    id="F2",
    title="DoRA + FSDP2 mixed precision + checkpointing: float32/bfloat16 recompute mismatch",
    upstream=(
        "huggingface/peft#1910",
        "huggingface/peft#1737",
        "huggingface/peft#1984",
        "pytorch/pytorch#159359",
        "pytorch/pytorch#148831",
        "pytorch/pytorch PR #182580 (fix: cast forward inputs during AC recompute)",
    ),
    signatures=(
        Signature(
            id="F2.recompute-dtype",
            exception=CHECKPOINT_ERROR,
            pattern=RECOMPUTE_METADATA_PATTERN,
            checks=(recomputed_dtype_float32_bfloat16,),
            description="CheckpointError listing a tensor saved in float32 and recomputed in bfloat16 (or the "
            "reverse), shapes unchanged",
        ),
    ),
    expectations=(
        Expectation(
            "bug",
            Outcome.REPRODUCED,
            {"torch": "<2.13", "transformers": "<5.23"},
            established_by=_ESTABLISHED,
            under=(TORCH_2_12_TF4,),
            observed={
                "torch": ("2.12.1",),
                "transformers": ("4.57.6", "5.11.0", "5.17.0", "5.20.2", "5.22.0", "5.22.1", "5.22.2"),
            },
            established_on="cpu",
        ),
        Expectation(
            "bug",
            Outcome.NOT_REPRODUCED,
            {"torch": ">=2.13"},
            established_by=_ESTABLISHED,
            under=(CURRENT, TF4),
            observed={"torch": ("2.13.0",)},
            established_on="cpu",
        ),
        Expectation(
            "bug",
            Outcome.NOT_REPRODUCED,
            {"transformers": ">=5.23"},
            established_by=_ESTABLISHED,
            under=(CURRENT, TORCH_2_12_TF4),
            observed={"transformers": ("5.23.0",)},
            established_on="cpu",
        ),
        Expectation("fixed", Outcome.PASS, {}, established_by=_ESTABLISHED),
    ),
    depends_on=("torch", "peft", "transformers"),
    depends_on_why=(
        "FSDP2 (torch) casts a layer's inputs in its pre-hook, which torch's recompute of transformers' checkpoint "
        "skips, around peft's DoRA; no DeepSpeed, accelerate or bitsandbytes runs"
    ),
    description=__doc__ or "",
    variants=(
        Variant(
            "reentrant",
            "reentrant checkpointing (use_reentrant=True)",
            {"use_reentrant": True},
            claim="huggingface/peft#1910 (closed with this workaround)",
        ),
        Variant(
            "no-checkpointing",
            "gradient checkpointing off",
            {"gradient_checkpointing": False},
            claim="huggingface/peft#1910",
        ),
    ),
)


def run(ctx: RankContext) -> None:
    from repros.trainer.fixed_trainer import train
    from repros.trainer.variants import scenario_for

    scenario, guards = scenario_for(ctx, SPEC, SCENARIO)
    train(scenario, ctx, guards)


# The fixed trainer's workaround of this failure: chosen by repros/trainer/guards.py (in its order), listed in
# docs/guards.md.
GUARD = GuardRule(
    "fsdp-uniform-dtypes",
    "F2",
    lambda s, v: s.engine == "fsdp2" and s.bf16 and not s.fsdp_root_mixed_precision,
    {"fsdp_root_mixed_precision": True},
    lambda v: "float32 tensors entering a checkpointed bf16 FSDP layer may be recomputed in another dtype (F2)",
    explained=(
        "under FSDP mixed precision, float32 tensors entering a checkpointed, bf16 layer are recomputed in "
        "another dtype on torch without the recompute cast fix (F2); put the root module under the same "
        "mixed-precision policy as the layers."
    ),
)
