"""F36 - An 8-bit optimizer decides 8-bit or float32 state by the size of the shard it is given, not of the
parameter: the same adapter trains otherwise when only the sharding changes.

bitsandbytes' 8-bit optimizers keep float32 state for a tensor of fewer than ``min_8bit_size`` (4096) elements
and 8-bit, blockwise-quantized state for a larger one, deciding on the tensor the optimizer is handed. Under
ZeRO-1/2/3 that tensor is DeepSpeed's flattened partition of every trainable parameter (under FSDP1 with flat
parameters, a unit's flat shard; bitsandbytes#2080): LoRA adapters whose every matrix one process keeps in float32
state (each well under 4096 elements) get 8-bit state together, and train otherwise, nothing raised or logged.
torchao's AdamW8bit decides on an FSDP2 DTensor's local shard the same way (torchao#4912, PR #4913 open). Both
reporters ran it on two CPU ranks with gloo.

bug:   ZeRO-2 in float32 with bitsandbytes' AdamW8bit as the client optimizer, held against one process training
       the same adapter with the same optimizer (``crosscheck``'s comparison).
fixed: the fixed trainer's guard keeps float32 state under sharding (torch's AdamW): one process's decision for
       these tensors, at the memory float32 state costs (8 bytes a trainable element instead of 2).
"""

from __future__ import annotations

from repros.catalog._stacks import CURRENT, DS_0_19_2, TF4_DS_0_18
from repros.runtime.context import RankContext
from repros.runtime.outcomes import Outcome
from repros.runtime.spec import Diverges, Expectation, ReproSpec, Signature, Variant
from repros.trainer.crosscheck.strategy import diverged_strategy, parse
from repros.trainer.guards import GuardRule

#: What runs: ZeRO-2 in float32 with bitsandbytes' AdamW8bit.
STRATEGY = "zero2-fp32-adamw8bit"
_ESTABLISHED = (
    "python -m harness run --lane ci --repros F36 (2026-11-29, torch 2.13.0+cpu, 2 ranks, gloo): REPRODUCED with "
    "bitsandbytes 0.50.2 (deepspeed 0.18.0, 0.19.2 and 0.19.8; transformers 4.43.0, 4.57.6 and 5.23.0), PASS through "
    "the guard; INFRA with bitsandbytes 0.47.0, and with 0.48.2 and 0.49.2 (run --cells current --repros F36 --pin "
    "bitsandbytes==X): no 8-bit AdamW on a CPU there, so the one-process reference cannot train"
)
_CPU_NOTE = (
    "bitsandbytes before 0.50 has no 8-bit AdamW for CPU tensors (its step raises AttributeError: 'NoneType' object "
    "has no attribute 'shape'): the one-process reference cannot train, so nothing is compared; a GPU runner can"
)


def sharded_8bit(message: str) -> bool:
    """The strategy that diverged shards the optimizer's tensors (ZeRO 1-3, FSDP) and steps them with an 8-bit
    optimizer."""
    strategy = diverged_strategy(message)
    if strategy is None or strategy.optimizer != "adamw8bit":
        return False
    return (strategy.engine == "deepspeed" and (strategy.stage or 0) >= 1) or strategy.engine in ("fsdp1", "fsdp2")


SPEC = ReproSpec(
    id="F36",
    title="an 8-bit optimizer decides 8-bit or float32 state by the local shard's size: sharding changes training",
    upstream=(
        "bitsandbytes-foundation/bitsandbytes#2080",
        "bitsandbytes-foundation/bitsandbytes PR #2081 (a prototype, open)",
        "pytorch/ao#4912",
        "pytorch/ao PR #4913 (open)",
    ),
    signatures=(
        Signature(
            id="F36.state-precision-by-shard",
            exception="repros.trainer.silent_failures.TrainsUnlikeOneProcess",
            pattern=r"trains unlike one process: (weight|saved_adapter|reloaded|merged|grad_norm|gradient|loss)",
            checks=(sharded_8bit,),
            description="a sharded strategy with an 8-bit optimizer trains otherwise than one process with the same "
            "optimizer (the state's precision was decided on a shard), nothing raised",
        ),
    ),
    expectations=(
        Expectation(
            "bug",
            Outcome.REPRODUCED,
            {"bitsandbytes": ">=0.50"},
            established_by=_ESTABLISHED,
            under=(CURRENT, DS_0_19_2, TF4_DS_0_18),
            observed={"bitsandbytes": ("0.50.2",)},
            established_on="cpu",
        ),
        Expectation(
            "bug",
            Outcome.INFRA,
            {"bitsandbytes": "<0.50"},
            established_by=_ESTABLISHED,
            note=_CPU_NOTE,
            device="cpu",
            under=(CURRENT,),
            observed={"bitsandbytes": ("0.47.0", "0.48.2", "0.49.2")},
        ),
        Expectation("fixed", Outcome.PASS, {"bitsandbytes": ">=0.50"}, established_by=_ESTABLISHED),
        Expectation(
            "fixed", Outcome.INFRA, {"bitsandbytes": "<0.50"}, established_by=_ESTABLISHED, note=_CPU_NOTE, device="cpu"
        ),
    ),
    depends_on=("torch", "deepspeed", "bitsandbytes", "peft"),
    depends_on_why=(
        "bitsandbytes decides the state on the partition deepspeed hands it, of a peft adapter's parameters, in "
        "torch; transformers builds the model and takes no part in the step"
    ),
    description=__doc__ or "",
    # The state's 8-bit rounding accumulates step by step: eight steps set it well beyond AdamW's tolerance (seeds
    # 0-4: 2.7 to 4.2 times it; the same with float32 state: at most 0.05 times).
    steps=8,
    pass_rule="agrees",
    # In float32: with bf16 compute an adaptive optimizer's tolerance is too wide to see the 8-bit state's rounding.
    diverges=(
        Diverges(
            ("zero[123]-fp32*-adamw8bit",),
            {"bitsandbytes": ">=0.50"},
            "python -m harness crosscheck --cells current --strategies zero2-fp32-adamw8bit,zero2-fp32-adamw,"
            "ddp-fp32-adamw8bit --repeat 5 (2026-11-29, bitsandbytes 0.50.2, deepspeed 0.19.8, torch 2.13.0+cpu): "
            "zero2's DIVERGES on every seed, the others agree",
        ),
    ),
    variants=(Variant("ddp", "DDP instead (each parameter whole: one process's decision)", {"engine": "ddp"}),),
)


def run(ctx: RankContext) -> None:
    from repros.trainer.crosscheck.check import crosscheck_repro

    variant = str(ctx.params.get("variant") or "")
    crosscheck_repro(ctx, SPEC, parse("ddp-fp32-adamw8bit" if variant == "ddp" else STRATEGY))


# The fixed trainer's workaround of this failure: chosen by repros/trainer/guards.py (in its order), listed in
# docs/guards.md.
GUARD = GuardRule(
    "fp32-state-under-sharding",
    "F36",
    lambda s, v: (
        s.optimizer == "adamw8bit"
        and ((s.engine == "deepspeed" and s.zero_stage >= 1) or s.engine in ("fsdp1", "fsdp2"))
    ),
    {"optimizer": "adamw"},
    lambda v: (
        "an 8-bit optimizer decides and quantizes its state per tensor it is given: under ZeRO's flattened "
        "partitions or FSDP's shards that is a shard, not a parameter, so a parameter gets 8-bit state where one "
        "process gives it float32 (bitsandbytes#2080, torchao#4912; F36): keep float32 state (torch's AdamW)"
    ),
    explained=(
        "an 8-bit optimizer (bitsandbytes' ``AdamW8bit``) decides and quantizes its state per tensor it is given; "
        "under ZeRO's flattened partitions or FSDP's shards that is a shard, not a parameter, so a parameter gets "
        "8-bit state where one process gives it float32 (F36, bitsandbytes#2080, torchao#4912): keep float32 "
        "state (torch's ``AdamW``)."
    ),
)
