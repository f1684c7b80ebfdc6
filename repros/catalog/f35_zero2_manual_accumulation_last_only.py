"""F35 - ZeRO-1/2, ``backward()`` several times per step with ``gradient_accumulation_steps: 1``: only the last
micro-batch's gradient is applied.

A loop that accumulates by hand (open-instruct's, TRL's and many RL trainers': several ``engine.backward()`` per
``engine.step()``) while the DeepSpeed config says ``gradient_accumulation_steps: 1`` makes every ``backward`` a
gradient-accumulation boundary. At a boundary ZeRO-1/2's epilogue hands the reduced gradient to
``averaged_gradients`` and resets its accumulator (``all_grad_tensors[i] = None``), so each ``backward`` replaces
the last and the step applies the last micro-batch's gradient only. Nothing is raised or logged: the loss is
logged as usual and training goes on, weaker (accelerate#3877 may be the same). ZeRO-3 counts micro-steps apart
from the boundary and keeps them all. DeepSpeed 0.19.4 added ``managed_gradient_accumulation`` (PRs #8184,
#8203, #8217; offload in 0.19.5, #8225): false hands the boundary to ``step()``; the default still drops them.
open-instruct PR #1498 works around it with ``set_gradient_accumulation_boundary``.

bug:   ZeRO-2, float32, two micro-batches per step accumulated by hand, config gradient_accumulation_steps 1, held
       against one process training the same adapter on the same global batch (``crosscheck``'s comparison).
fixed: the same through the fixed trainer's guard: ``set_gradient_accumulation_boundary(False)`` before each
       ``backward`` but the last.
"""

from __future__ import annotations

from dataclasses import replace

from repros.catalog._stacks import CURRENT, TF4_DS_0_18
from repros.runtime.context import RankContext
from repros.runtime.outcomes import Outcome
from repros.runtime.spec import Expectation, ReproSpec, Signature, Variant
from repros.trainer.crosscheck.strategy import diverged_strategy, parse
from repros.trainer.guards import GuardRule

#: What runs: ZeRO-2 in float32 with the micro-batches accumulated by hand.
STRATEGY = "zero2-fp32-accum-manual"
_ESTABLISHED = (
    "python -m harness run --matrix matrix.yaml --lane nightly --repros F35 (2026-11-29, torch 2.13.0+cpu, 2 ranks, "
    "gloo): REPRODUCED with deepspeed 0.17.6, 0.18.0, 0.19.2, 0.19.3 and 0.19.8; PASS through the guard in each"
)


def zero12_by_hand(message: str) -> bool:
    """The strategy that diverged is ZeRO-1/2 accumulating by hand."""
    strategy = diverged_strategy(message)
    return strategy is not None and strategy.stage in (1, 2) and strategy.accumulation == "manual"


SPEC = ReproSpec(
    id="F35",
    title=(
        "ZeRO-1/2 with several backward() per step and gradient_accumulation_steps 1 applies the last micro-batch only"
    ),
    upstream=(
        "allenai/open-instruct PR #1498",
        "deepspeedai/DeepSpeed PR #8184 (managed_gradient_accumulation, 0.19.4), PR #8203, PR #8217",
        "deepspeedai/DeepSpeed PR #8225 (offload, 0.19.5)",
        "deepspeedai/DeepSpeed PR #7981 (offloaded ZeRO-1/2, the same loss)",
        "huggingface/accelerate#3877",
    ),
    signatures=(
        Signature(
            id="F35.last-micro-batch-only",
            exception="repros.trainer.silent_failures.TrainsUnlikeOneProcess",
            pattern=r"trains unlike one process: (grad_norm|gradient|weight|loss|saved_adapter|reloaded|merged)",
            checks=(zero12_by_hand,),
            description="a ZeRO-1/2 strategy accumulating by hand trains otherwise than one process on the same "
            "global batch (its gradient is the last micro-batch's), nothing raised",
        ),
    ),
    expectations=(
        Expectation(
            "bug",
            Outcome.REPRODUCED,
            {"deepspeed": ">=0.17"},
            established_by=_ESTABLISHED,
            under=(CURRENT, TF4_DS_0_18),
        ),
        Expectation("fixed", Outcome.PASS, {}, established_by=_ESTABLISHED),
    ),
    depends_on=("torch", "deepspeed", "peft", "transformers"),
    depends_on_why=(
        "the reset is ZeRO-1/2's (deepspeed) at each backward torch runs through a peft adapter on a transformers "
        "model; nothing of accelerate or bitsandbytes takes part"
    ),
    description=__doc__ or "",
    steps=4,
    pass_rule="agrees",
    variants=(
        Variant(
            "zero3",
            "ZeRO-3 instead (it counts micro-steps apart from the boundary)",
            {"zero_stage": 3},
            claim="open-instruct PR #1498",
        ),
        Variant(
            "boundary",
            "set_gradient_accumulation_boundary(False) before each backward but the last",
            {"deepspeed_accumulation_boundary": True},
            claim="open-instruct PR #1498",
        ),
    ),
)


def run(ctx: RankContext) -> None:
    from repros.trainer.crosscheck.check import crosscheck_repro

    variant = str(ctx.params.get("variant") or "")
    strategy = parse("zero3-fp32-accum-manual" if variant == "zero3" else STRATEGY)
    crosscheck_repro(ctx, SPEC, strategy, lambda s: replace(s, deepspeed_accumulation_boundary=False))


# The fixed trainer's workaround of this failure: chosen by repros/trainer/guards.py (in its order), listed in
# docs/guards.md.
GUARD = GuardRule(
    "deepspeed-accumulation-boundary",
    "F35",
    lambda s, v: (
        s.engine == "deepspeed"
        and s.zero_stage in (1, 2)
        and s.manual_accumulation > 1
        and s.gradient_accumulation_steps == 1
        and not s.deepspeed_accumulation_boundary
    ),
    {"deepspeed_accumulation_boundary": True},
    lambda v: (
        "ZeRO-1/2 with gradient_accumulation_steps 1 takes every backward() as the step's boundary and resets "
        "its gradient accumulator there, so only the last micro-batch of a step is applied (F35, open-instruct "
        "PR #1498): set_gradient_accumulation_boundary(False) before each backward but the last"
    ),
    explained=(
        "ZeRO-1/2 with ``gradient_accumulation_steps`` 1 and several ``backward()`` calls per optimizer step "
        "(manual accumulation) takes every ``backward()`` as the step's boundary and resets its gradient "
        "accumulator there, so only the last micro-batch is applied, in every release (F35, open-instruct PR "
        "#1498): ``set_gradient_accumulation_boundary(False)`` before each backward but the last."
    ),
)
