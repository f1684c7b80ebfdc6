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

Before 0.18.3 it is worse (DeepSpeed#7718, from 0.17.6): ZeRO-2 applies the last micro-batch's gradient only
whatever the boundary says, accumulated by the engine (``gradient_accumulation_steps`` > 1) or by hand with the
boundary told, and the loop above raises ``TypeError: 'NoneType' object is not iterable`` in ZeRO-2's
gradient epilogue (DeepSpeed#7629). ZeRO-1 and ZeRO-3 accumulate correctly there; 0.18.3 fixed ZeRO-2
(bisected here: ``bisect --repro F35 --mode fixed --package deepspeed --good 0.19.2 --bad 0.18.0`` -> 0.18.3).

bug:   ZeRO-2, float32, two micro-batches per step accumulated by hand, config gradient_accumulation_steps 1, held
       against one process training the same adapter on the same global batch (``crosscheck``'s comparison).
fixed: the same through the fixed trainer's guards: ``set_gradient_accumulation_boundary(False)`` before each
       ``backward`` but the last; before 0.18.3, ZeRO-1 instead of ZeRO-2 as well.
"""

from __future__ import annotations

from dataclasses import replace

from packaging.version import Version

from repros.catalog._stacks import CURRENT, DS_0_19_2, TF4, TF4_DS_0_18
from repros.runtime.context import RankContext
from repros.runtime.outcomes import Outcome
from repros.runtime.spec import Diverges, Expectation, ReproSpec, Signature, Variant
from repros.trainer.crosscheck.strategy import diverged_strategy, parse
from repros.trainer.guards import GuardRule

#: What runs: ZeRO-2 in float32 with the micro-batches accumulated by hand.
STRATEGY = "zero2-fp32-accum-manual"
_ESTABLISHED = (
    "python -m harness run --lane ci --repros F35 (2026-11-29, torch 2.13.0+cpu, 2 ranks, gloo): REPRODUCED with "
    "deepspeed 0.19.2 and 0.19.8 (transformers 4.43.0, 4.57.6 and 5.23.0), PASS through the guard; with 0.18.0 the "
    "loop raised DeepSpeed#7629's TypeError and the boundary did not help (FAIL); python -m harness bisect --repro "
    "F35 --mode fixed --package deepspeed --good 0.19.2 --bad 0.18.0 -> first good: deepspeed==0.18.3 (6 steps: "
    "0.18.0, 0.18.1, 0.18.2 FAIL; 0.18.3, 0.18.6, 0.19.2 PASS); run --cells current --repros F35 --pin "
    "deepspeed==0.18.2 / ==0.18.3: DIFFERENT_ERROR (the TypeError) / REPRODUCED"
)
_CROSSCHECKED = (
    "python -m harness crosscheck --cells tf4-ds-0.18.0 --strategies <the 42 of the ci lane, the pairwise cover and "
    "nine with AdamW> (2026-11-29, torch 2.13.0+cpu, transformers 4.57.6, 2 ranks, gloo): zero2-fp32-accum-manual, "
    "zero2-bf16-accum-manual and zero2-fp32-ckpt-nr-accum-engine DIVERGED (the gradient norm at step 0, 0.25 "
    "below the reference's), every ZeRO-1 and ZeRO-3 strategy that accumulates agreed"
)


def zero12_accumulating(message: str) -> bool:
    """The strategy that diverged is ZeRO-1/2 accumulating micro-batches (by hand, or before 0.18.3 by the
    engine as well)."""
    strategy = diverged_strategy(message)
    return strategy is not None and strategy.stage in (1, 2) and strategy.accumulation != "none"


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
        "deepspeedai/DeepSpeed#7718 (ZeRO-2 from 0.17.6: accumulated gradients wrong; fixed in 0.18.3, trl#4540)",
        "deepspeedai/DeepSpeed#7629 (ZeRO-2 from 0.17.6: TypeError at the second backward of a step)",
    ),
    signatures=(
        Signature(
            id="F35.last-micro-batch-only",
            exception="repros.trainer.silent_failures.TrainsUnlikeOneProcess",
            pattern=r"trains unlike one process: (grad_norm|gradient|weight|loss|saved_adapter|reloaded|merged)",
            checks=(zero12_accumulating,),
            description="a ZeRO-1/2 strategy accumulating micro-batches trains otherwise than one process on the "
            "same global batch (its gradient is the last micro-batch's), nothing raised",
        ),
    ),
    expectations=(
        Expectation(
            "bug",
            Outcome.REPRODUCED,
            {"deepspeed": ">=0.18.3"},
            established_by=_ESTABLISHED,
            under=(CURRENT, DS_0_19_2, TF4),
            observed={"deepspeed": ("0.18.3", "0.19.2", "0.19.8")},
            established_on="cpu",
        ),
        Expectation(
            "bug",
            Outcome.DIFFERENT_ERROR,
            {"deepspeed": ">=0.17.6,<0.18.3"},
            established_by=_ESTABLISHED,
            note="before 0.18.3 the loop is not silent: ZeRO-2's gradient epilogue raises \"TypeError: 'NoneType' "
            'object is not iterable" at the second backward() of a step (DeepSpeed#7629)',
            under=(TF4_DS_0_18,),
            observed={"deepspeed": ("0.18.0", "0.18.2")},
            established_on="cpu",
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
    # Before 0.18.3 ZeRO-2 drops all but the last micro-batch however it accumulates (DeepSpeed#7718).
    diverges=(Diverges(("zero2-*-accum-*",), {"deepspeed": ">=0.17.6,<0.18.3"}, _CROSSCHECKED),),
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


#: ZeRO-2 keeps only the last micro-batch's gradient however it accumulates (DeepSpeed#7718, #7629), from 0.17.6
#: until 0.18.3 (bisected, F35's fixed mode).
DEEPSPEED_Z2_ACCUMULATION_BROKEN = (Version("0.17.6"), Version("0.18.3"))

# The fixed trainer's workaround before 0.18.3, chosen before GUARD (which then tells ZeRO-1 the boundary).
GUARD_BEFORE_0_18_3 = GuardRule(
    "zero1-accumulation-before-0.18.3",
    "F35",
    lambda s, v: (
        s.engine == "deepspeed"
        and s.zero_stage == 2
        and (s.manual_accumulation > 1 or s.gradient_accumulation_steps > 1)
        and (deepspeed := v.get("deepspeed")) is not None
        and DEEPSPEED_Z2_ACCUMULATION_BROKEN[0] <= deepspeed < DEEPSPEED_Z2_ACCUMULATION_BROKEN[1]
    ),
    {"zero_stage": 1},
    lambda v: (
        f"deepspeed {v.get('deepspeed')} (>= {DEEPSPEED_Z2_ACCUMULATION_BROKEN[0]}, < "
        f"{DEEPSPEED_Z2_ACCUMULATION_BROKEN[1]}): ZeRO-2 applies only the last micro-batch's gradient however it "
        "accumulates, the boundary said or not (F35, DeepSpeed#7718): ZeRO-1 instead, which accumulates "
        "correctly there (the gradients are kept whole on every rank: more memory)"
    ),
    explained=(
        "DeepSpeed 0.17.6 .. 0.18.2: ZeRO-2 applies only the last micro-batch's gradient however it accumulates "
        "(by the engine, or by hand with the boundary said), and several ``backward()`` per step at "
        "``gradient_accumulation_steps`` 1 raise a ``TypeError`` (F35, DeepSpeed#7718, #7629; fixed in 0.18.3): "
        "ZeRO-1 instead, which accumulates correctly there, at the memory of whole gradients on every rank."
    ),
)

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
