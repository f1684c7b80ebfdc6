"""F13 - PEFT ``modules_to_save`` under ZeRO-3: ``'Linear' object has no attribute 'ds_grads_remaining'``.

ZeRO-3 gives every module a pair of autograd functions (``pre_bwd_fn``, ``post_bwd_fn``) whose
closures and counters (``ds_grads_remaining``, ``applied_pre_backward_ref_cnt``) belong to that
module. DeepSpeed PR #7062 (0.16.5) made them at hook registration, children before their parent,
and only ``if not hasattr(module, "post_bwd_fn")``. PEFT's ``ModulesToSaveWrapper`` (what
``modules_to_save`` puts around ``lm_head`` or ``embed_tokens``) hands unknown attributes on to the
module it wraps, so ``hasattr`` finds the child's functions and the wrapper gets none of its own. In
the first forward the wrapper's pre-hook applies the child's ``post_bwd_fn``, whose forward counts
on the child's ``ds_grads_remaining``, which the child's own hook has not set yet:
``AttributeError: 'Linear' object has no attribute 'ds_grads_remaining'``. Training cannot start,
with or without ``zero.Init``, whatever the trainer. DeepSpeed PR #8144 (0.19.3) looks in the
module's own ``__dict__`` instead.

bug:   tiny Qwen2, LoRA r=8 on q/v with ``modules_to_save=["lm_head"]``, float32, ZeRO-3 (default
       persistence threshold), the fixed trainer's own loop, no ``zero.Init``.
fixed: the same scenario through the fixed trainer's guards (``zero2-for-modules-to-save`` on
       deepspeed 0.16.5 .. 0.19.2: ZeRO-2, every parameter whole on every rank).

F9 (peft 0.15.0 saving ``modules_to_save`` copies empty) meets this first on deepspeed < 0.19.3: its
bug mode there is a ``DIFFERENT_ERROR``, this failure.
"""

from __future__ import annotations

from packaging.version import Version

from repros.catalog._stacks import CURRENT, TF4, stack
from repros.runtime.context import RankContext
from repros.runtime.outcomes import Outcome
from repros.runtime.spec import Expectation, ReproSpec, Signature, Variant
from repros.trainer.guards import GuardRule
from repros.trainer.scenario import Scenario

SCENARIO = Scenario(
    engine="deepspeed",
    zero_stage=3,
    bf16=False,
    gradient_checkpointing=False,
    modules_to_save=("lm_head",),
    # A whole lm_head trains too: at the default 1e-2 its loss oscillates at the small model (costs).
    learning_rate=1e-3,
)

# Established by running (2026-11-26, torch 2.13.0+cpu, peft 0.21.2, 2 ranks, gloo): bug REPRODUCED on deepspeed
# 0.19.2 (transformers 5.23.0) and 0.18.0 (4.57.6), NOT_REPRODUCED on 0.19.3 and 0.19.8; fixed PASS in all (ZeRO-2
# where it reproduces); then the bisects below. The lower end, 0.16.5, is PR #7062's release (its diff moves the
# hasattr-guarded hook classes from the forward hook to registration; DeepSpeed#7615 trains on 0.16.4).
_ESTABLISHED = (
    "python -m harness run --cells ds-0.19.2,current,ds-0.19.3,tf4-ds-0.18.0,tf4-ds-0.17.6 --repros F12,F13,F21 "
    "--jobs 1 (2026-11-26); python -m harness bisect --repro F13 --mode bug --package deepspeed --good 0.19.3 "
    "--bad 0.19.2 --cell ds-0.19.2 -> first good: deepspeed==0.19.3 (2 steps, 97 s)"
    "; lower end: python -m harness bisect --repro F13 --mode bug --package deepspeed --good 0.16.4 --bad 0.16.5 "
    "--cell tf4-ds-0.18.0 -> 0.16.5 REPRODUCED, 0.16.4 UNRESOLVABLE (error: Failed to build `deepspeed==0.16.4` "
    "beside torch 2.13), so 0.16.5 as the first bad release rests on PR #7062's diff and DeepSpeed#7615"
)

SPEC = ReproSpec(
    id="F13",
    title="modules_to_save under ZeRO-3: 'Linear' object has no attribute 'ds_grads_remaining'",
    upstream=(
        "deepspeedai/DeepSpeed#7203",
        "deepspeedai/DeepSpeed#7615",
        "deepspeedai/DeepSpeed PR #8144 (fix: hook state looked up in the module's own __dict__; 0.19.3)",
        "deepspeedai/DeepSpeed PR #7062 (0.16.5: the hook classes made at registration)",
    ),
    signatures=(
        Signature(
            id="F13.ds-grads-remaining",
            exception="AttributeError",
            pattern=r"^'\w+' object has no attribute 'ds_grads_remaining'",
            description="a ZeRO-3 post-backward function applied through an attribute-delegating wrapper "
            "(PEFT's ModulesToSaveWrapper) before the wrapped module's counter exists",
        ),
    ),
    expectations=(
        Expectation(
            "bug",
            Outcome.REPRODUCED,
            {"deepspeed": ">=0.16.5,<0.19.3"},
            established_by=_ESTABLISHED,
            under=(CURRENT, TF4),
            observed={"deepspeed": ("0.16.5", "0.18.0", "0.19.2")},
            established_on="cpu",
        ),
        Expectation(
            "bug",
            Outcome.NOT_REPRODUCED,
            {},
            established_by=_ESTABLISHED,
            under=(CURRENT, stack(deepspeed="0.19.3")),
            established_on="cpu",
        ),
        Expectation("fixed", Outcome.PASS, {}, established_by=_ESTABLISHED),
    ),
    variants=(
        Variant(
            "zero2",
            "ZeRO-2 instead of ZeRO-3 (what the fixed trainer does where this fails; priced where it does not)",
            {"zero_stage": 2},
            claim="the fixed trainer's zero2-for-modules-to-save guard",
        ),
    ),
    depends_on=("torch", "deepspeed", "peft", "transformers"),
    depends_on_why=(
        "ZeRO-3's (deepspeed) backward hooks meet peft's modules_to_save wrapper of a transformers model on torch; "
        "the fixed trainer drives the engine itself, so accelerate takes no part, and nothing is quantized"
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
#: First DeepSpeed release seen training PEFT modules_to_save under ZeRO-3 (0.18.0 and 0.19.2 fail
#: with DeepSpeed#7615's AttributeError). Established by running F9 (repros/catalog/f9_modules_to_save_zero3.py)
#: and bisected by F13 (repros/catalog/f13_zero3_modules_to_save_ds_grads_remaining.py).
DEEPSPEED_Z3_MODULES_TO_SAVE_FIX = Version("0.19.3")

#: First DeepSpeed release that fails to train modules_to_save under ZeRO-3 (PR #7062). Bisected by F13.
DEEPSPEED_Z3_MODULES_TO_SAVE_BROKEN = Version("0.16.5")

GUARD = GuardRule(
    "zero2-for-modules-to-save",
    "F13",
    lambda s, v: (
        s.engine == "deepspeed"
        and s.zero_stage == 3
        and bool(s.modules_to_save)
        and (deepspeed := v.get("deepspeed")) is not None
        and DEEPSPEED_Z3_MODULES_TO_SAVE_BROKEN <= deepspeed < DEEPSPEED_Z3_MODULES_TO_SAVE_FIX
    ),
    {"zero_stage": 2},
    lambda v: (
        f"deepspeed {v.get('deepspeed')} (>= {DEEPSPEED_Z3_MODULES_TO_SAVE_BROKEN}, "
        f"< {DEEPSPEED_Z3_MODULES_TO_SAVE_FIX}) cannot train modules_to_save under ZeRO-3 "
        "('ds_grads_remaining', F13, DeepSpeed#7615)"
    ),
    explained=(
        "DeepSpeed 0.16.5 .. 0.19.2 cannot train PEFT ``modules_to_save`` under ZeRO-3 at all (\"'Linear' object "
        "has no attribute 'ds_grads_remaining'\" in the first forward, F13, DeepSpeed#7203/#7615, fixed by PR "
        "#8144 in 0.19.3); use ZeRO-2, which keeps every parameter whole on every rank (more memory per rank)."
    ),
)
