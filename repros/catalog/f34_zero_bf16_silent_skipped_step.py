"""F34 - DeepSpeed ZeRO under bf16 skips a step whose gradient is not finite and says nothing.

DeepSpeed 0.19.3 made bf16's gradient-overflow check the default (PR #8035, ``bf16.check_grad_overflow``): a ZeRO
step whose gradient holds an inf or a NaN clears the gradients and returns early. Under fp16 the dynamic loss
scaler reports the skip; bf16 always gets the static ``LossScaler``, whose ``update_scale`` did nothing, and the
engine's ``skipped_steps`` is printed only every ``steps_per_print`` steps, unset by default. So ``engine.step()``
returns, the scheduler steps, the loss is logged, and no weight moves: a bf16 RL run whose every step was skipped
looked healthy (DeepSpeed#8415; PRs #8417 and #8426, open). DeepSpeed 0.19.8's ``LossScalerBase.update_scale``
logs "OVERFLOW! Skipping step. Gradients are non-finite, weights were not updated." on rank 0. Before 0.19.3 a
bf16 step is not checked: the non-finite gradient is applied and the weights become NaN (what PR #8035 guards
against; loud by its consequence, not this failure).

The non-finite gradient comes as RL losses make it: a term that ``torch.where`` selects away over ``log(0)`` (a
masked token's log-probability): the loss stays finite, its backward multiplies an infinite gradient by the mask's
zero, NaN.

bug:   ZeRO-2, bf16, the loss's gradient not finite at step 1 of 4; DeepSpeed's own log read for a word of it.
fixed: the fixed trainer's guard: bf16 overflow checked (before 0.19.3 it is off) and every skipped step said.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from packaging.version import Version

from repros.catalog._stacks import CURRENT
from repros.runtime.context import RankContext
from repros.runtime.outcomes import Outcome
from repros.runtime.spec import Expectation, ReproSpec, Signature, Variant
from repros.trainer.guards import GuardRule
from repros.trainer.scenario import Scenario

#: The documented configuration: ZeRO-2 in bf16, a non-finite gradient at step 1.
SCENARIO = Scenario(zero_stage=2, bf16=True, gradient_checkpointing=False, nonfinite_grad_at_step=1)
#: What DeepSpeed's logger writes about a skipped step, in the releases that say it.
SAID = ("OVERFLOW", "Skipping step", "skipped")
_ESTABLISHED = (
    "python -m harness bisect --repro F34 --mode bug --package deepspeed --good 0.19.8 --bad 0.19.3 (2026-11-29, "
    "torch 2.13.0+cpu, 2 ranks, gloo): 0.19.3, 0.19.5, 0.19.6, 0.19.7 REPRODUCED, first good 0.19.8 (it logs the "
    "skip); python -m harness run --cells ds-0.19.2,ds-0.19.3,current --repros F34: 0.19.2 applies the step "
    "(NOT_REPRODUCED), PASS through the guard in all three"
)

SPEC = ReproSpec(
    id="F34",
    title="DeepSpeed ZeRO under bf16 skips a step whose gradient is not finite and says nothing",
    upstream=(
        "deepspeedai/DeepSpeed#8415",
        "deepspeedai/DeepSpeed PR #8035 (bf16 overflow check on by default, 0.19.3)",
        "deepspeedai/DeepSpeed PR #8417, PR #8426 (open)",
    ),
    signatures=(
        Signature(
            id="F34.skipped-silently",
            exception="repros.trainer.silent_failures.OptimizerStepSkippedSilently",
            pattern=r"optimizer steps? .*skipped.*nothing (was )?(logged|said)",
            description="the engine took fewer optimizer steps than it was asked and neither DeepSpeed nor the "
            "trainer said so; the loss was logged as usual",
        ),
    ),
    expectations=(
        Expectation(
            "bug",
            Outcome.REPRODUCED,
            {"deepspeed": ">=0.19.3,<0.19.8"},
            established_by=_ESTABLISHED,
            under=(CURRENT,),
            observed={"deepspeed": ("0.19.3", "0.19.5", "0.19.6", "0.19.7")},
            established_on="cpu",
        ),
        Expectation(
            "bug",
            Outcome.NOT_REPRODUCED,
            {"deepspeed": ">=0.19.8"},
            established_by=_ESTABLISHED,
            under=(CURRENT,),
            observed={"deepspeed": ("0.19.8",)},
            established_on="cpu",
        ),
        Expectation(
            "bug",
            Outcome.NOT_REPRODUCED,
            {"deepspeed": "<0.19.3"},
            established_by=_ESTABLISHED,
            under=(CURRENT,),
            observed={"deepspeed": ("0.19.2",)},
            established_on="cpu",
        ),
        Expectation("fixed", Outcome.PASS, {}, established_by=_ESTABLISHED),
    ),
    depends_on=("torch", "deepspeed", "peft", "transformers"),
    depends_on_why=(
        "the skip and its silence are deepspeed's (its ZeRO optimizer and loss scaler) over torch's non-finite "
        "gradient of a peft adapter on a transformers model; accelerate and bitsandbytes take no part"
    ),
    description=__doc__ or "",
    steps=4,
    variants=(Variant("zero3", "ZeRO-3 instead", {"zero_stage": 3}),),
)


@contextmanager
def deepspeed_log() -> Iterator[list[str]]:
    """Every record DeepSpeed's logger writes meanwhile (rank 0 is where it logs the skip)."""
    said: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.append(record.getMessage())

    logger = logging.getLogger("DeepSpeed")
    handler = Keep(level=logging.DEBUG)
    logger.addHandler(handler)
    try:
        yield said
    finally:
        logger.removeHandler(handler)


def run(ctx: RankContext) -> None:
    import torch.distributed as dist

    from repros.trainer.fixed_trainer import train_deepspeed
    from repros.trainer.silent_failures import OptimizerStepSkippedSilently
    from repros.trainer.variants import scenario_for

    scenario, guards = scenario_for(ctx, SPEC, SCENARIO)
    with deepspeed_log() as said:
        train_deepspeed(scenario, ctx, guards)
    steps = ctx.facts["optimizer_steps"]
    words = [line for line in said if any(word in line for word in SAID)]
    # DeepSpeed logs on rank 0 only: every rank hears what rank 0 heard.
    heard = [bool(words)]
    if dist.is_initialized():
        dist.broadcast_object_list(heard, src=0)
    steps["said_by_deepspeed"] = heard[0]
    steps["deepspeed_said"] = words[:3]
    if steps["skipped_at"] and not heard[0] and not steps["said_by_trainer"]:
        raise OptimizerStepSkippedSilently(
            f"{len(steps['skipped_at'])} of {steps['asked']} optimizer steps were skipped by the engine (at step "
            f"{', '.join(map(str, steps['skipped_at']))}: the gradient was not finite) and nothing was logged: the "
            f"loss was logged as usual ({', '.join(f'{v}' for v in ctx.facts['train']['losses'])})"
        )


# The fixed trainer's workaround of this failure: chosen by repros/trainer/guards.py (in its order), listed in
# docs/guards.md.
#: DeepSpeed 0.19.3 made bf16's gradient-overflow check the default (PR #8035): a bf16 ZeRO step whose
#: gradient is not finite is skipped. 0.19.8 is the first release whose skip is logged (``LossScalerBase.
#: update_scale``, "OVERFLOW! Skipping step"); bisected by F34 (repros/catalog/f34_zero_bf16_silent_skipped_step.py).
DEEPSPEED_BF16_OVERFLOW_CHECK = Version("0.19.3")

DEEPSPEED_SKIPPED_STEP_LOGGED = Version("0.19.8")

GUARD = GuardRule(
    "say-skipped-steps",
    "F34",
    lambda s, v: (
        s.engine == "deepspeed"
        and s.bf16
        and s.zero_stage >= 1
        and not s.say_skipped_steps
        and (deepspeed := v.get("deepspeed")) is not None
        and deepspeed < DEEPSPEED_SKIPPED_STEP_LOGGED
    ),
    {"say_skipped_steps": True, "deepspeed_bf16_overflow_check": True},
    lambda v: (
        f"deepspeed {v.get('deepspeed')} (< {DEEPSPEED_SKIPPED_STEP_LOGGED}) says nothing when a bf16 ZeRO step "
        "is skipped for a non-finite gradient (from 0.19.3, PR #8035), or applies it unchecked (before): check for "
        "overflow and say every skipped step (F34, DeepSpeed#8415)"
    ),
    explained=(
        "DeepSpeed 0.19.3 .. 0.19.7 skip a bf16 ZeRO step whose gradient is not finite (the overflow check PR "
        "#8035 made the default) and say nothing; before 0.19.3 the step is applied unchecked (F34, "
        "DeepSpeed#8415; 0.19.8 logs the skip): check for overflow and say every skipped step."
    ),
)
