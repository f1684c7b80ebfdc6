"""F20 - a DeepSpeed config that leaves out what the TrainingArguments set: the engine's defaults win, silently.

transformers' ``Trainer`` and the DeepSpeed config both say the micro batch, the gradient accumulation,
the gradient clipping and the learning rate. transformers PR #12021 (4.7) made the Trainer refuse a
config whose *explicit* value disagrees with the ``TrainingArguments`` (``ValueError: Please correct
the following DeepSpeed config values that mismatch TrainingArguments values: - ds
gradient_accumulation_steps=4 vs hf gradient_accumulation_steps=2 ...``) and fill every ``"auto"``
value from them. A key the config leaves out is neither filled nor checked: accelerate's
``DeepSpeedPlugin`` then writes ``gradient_accumulation_steps: 1`` into the config (after the
Trainer's check ran), and DeepSpeed's own defaults stand for the rest. Who decides the accumulation
boundary decides what that does. accelerate before 1.8.0 has ``DeepSpeedEngineWrapper.backward``
call ``engine.step()`` after every backward and leaves the boundary to the engine's own count: with 1 in
the config and ``gradient_accumulation_steps=2`` in the ``TrainingArguments``, DeepSpeed steps the
optimizer after every micro batch, twice per Trainer step, each on half the batch the user asked for
(and on a loss the Trainer already halved), and nothing raises or warns (accelerate#3552, #3369).
accelerate PR #3630 (1.8.0) sets the engine's boundary from its own ``sync_gradients`` and steps
only there: the engine still reports 1, but the optimizer steps once per Trainer step, as asked.

bug:   tiny Qwen2, LoRA r=8 on q/v by ``get_peft_model``, trained by transformers' ``Trainer`` with
       ``TrainingArguments(gradient_accumulation_steps=2, deepspeed=...)``, the DeepSpeed config
       HF's guide writes (ZeRO-2, bf16, ``WarmupLR``, ``"auto"`` values) but without its
       ``gradient_accumulation_steps`` entry; on a CPU ``use_cpu=True``. After training the engine's
       micro batch, clipping and peak learning rate are compared with what the ``TrainingArguments``
       asked for, and the engine's optimizer steps with the Trainer's (``DeepSpeedConfigDisagrees``
       when any differs).
fixed: the same scenario through the fixed trainer's guards (``ds-config-auto``: every shared value
       written as ``"auto"``, so transformers fills it from the ``TrainingArguments`` or, where the
       user wrote a number, checks it).

The loud form, a conflicting explicit value (``F20.mismatch-error``), is transformers' own refusal in
every release since 4.7 (the wording as CarperAI/trlx#376 and transformers PR #12021 print it); it is a
signature here so that ``explain`` names it, not a scenario the repro runs. Other keys left out
(``gradient_clipping``, the scheduler's ``warmup_max_lr``) are compared too, but not left out here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from repros.catalog._stacks import CURRENT, TF4, TF4_ACC_1_7
from repros.runtime.context import RankContext
from repros.runtime.outcomes import Outcome
from repros.runtime.spec import Expectation, ReproSpec, Signature
from repros.trainer.guards import GuardRule

#: What the user asked the Trainer for that the config leaves out.
GRADIENT_ACCUMULATION_STEPS = 2

# Established by running (2026-11-26, torch 2.13.0+cpu, deepspeed 0.19.8, peft 0.21.2, transformers 4.57.6, 2 ranks,
# gloo): accelerate 1.7.0 stepped the optimizer 10 times in 5 Trainer steps (REPRODUCED); 1.8.0, 1.8.1, 1.10.0,
# 1.13.0 and 1.15.0 (current, transformers 5.23.0 too) 5 in 5, the engine still reporting gradient accumulation 1
# (NOT_REPRODUCED); fixed PASS.
_ESTABLISHED = (
    "python -m harness bisect --repro F20 --mode bug --package accelerate --good 1.13.0 --bad 1.7.0 --cell tf4 -> "
    "first good: accelerate==1.8.0 (5 steps, 1319 s) (2026-11-26); python -m harness run --cells "
    "tf4-accelerate-1.7.0,current --repros F20 --jobs 1"
)


#: Values the engine reports that decide nothing by themselves: accelerate from 1.8.0 on (PR #3630) tells the engine
#: where each accumulation boundary is (``set_gradient_accumulation_boundary``) and steps it only there, so
#: a config's gradient accumulation of 1 beside the Trainer's 2 is only a number; what counts is how often
#: the optimizer stepped (``optimizer_steps`` against ``trainer_steps``).
_BOOKKEEPING = ("gradient_accumulation_steps",)


def disagreements(settings: Mapping[str, Any]) -> list[str]:
    """Each way the engine trained otherwise than the ``TrainingArguments`` asked, as ``name=used (asked
    asked)``: the values that take effect in the engine (micro batch, clipping; the peak learning rate only
    where DeepSpeed's own scheduler ran), and the optimizer stepping more or less often than the Trainer."""
    used: Mapping[str, Any] = settings.get("used") or {}
    asked: Mapping[str, Any] = settings.get("asked") or {}
    found = []
    for name, wanted in asked.items():
        got = used.get(name)
        if name in _BOOKKEEPING or (got is None and name == "peak_lr"):
            continue
        if got != wanted:
            found.append(f"{name}={got} (asked {wanted})")
    steps, trainer_steps = settings.get("optimizer_steps"), settings.get("trainer_steps")
    if steps != trainer_steps:
        accumulation = f"{used.get('gradient_accumulation_steps')} (asked {asked.get('gradient_accumulation_steps')})"
        found.append(
            f"optimizer_steps={steps} in {trainer_steps} Trainer steps (gradient_accumulation_steps={accumulation})"
        )
    return found


def raise_if_disagrees(settings: Mapping[str, Any], rank: int) -> None:
    from repros.trainer.silent_failures import DeepSpeedConfigDisagrees

    found = disagreements(settings)
    if found:
        raise DeepSpeedConfigDisagrees(
            f"DeepSpeed engine disagrees with the TrainingArguments on rank {rank}: {', '.join(found)}; "
            f"{settings.get('optimizer_steps')} optimizer steps in {settings.get('trainer_steps')} Trainer steps, "
            "nothing raised or warned"
        )


SPEC = ReproSpec(
    id="F20",
    title="A DeepSpeed config that leaves out what the TrainingArguments set: the engine's defaults win, silently",
    upstream=(
        "huggingface/transformers PR #12021 (the Trainer refuses explicit mismatches; 4.7)",
        "deepspeedai/DeepSpeed#1107 (the report that led to it)",
        "huggingface/transformers#25810 (gradient accumulation set in one place only)",
        "huggingface/accelerate#3369 (gradient accumulation with DeepSpeed when the config leaves it out)",
        "huggingface/accelerate#3552 (DeepSpeed's own accumulation boundary, not accelerate's, decides the step)",
        "huggingface/accelerate PR #3630 (the engine's boundary set from sync_gradients; the fix here)",
        "huggingface/accelerate PR #698 (the Accelerator's gradient accumulation overrides DeepSpeed's)",
        "CarperAI/trlx#376 (the mismatch error as users meet it)",
    ),
    signatures=(
        Signature(
            id="F20.silent-disagreement",
            exception="repros.trainer.silent_failures.DeepSpeedConfigDisagrees",
            pattern=r"^DeepSpeed engine disagrees with the TrainingArguments",
            description="no error, but the DeepSpeed engine stepped the optimizer more often than the Trainer "
            "(its own gradient accumulation, 1, deciding), or trained with another micro batch, clipping or peak "
            "learning rate than the TrainingArguments asked for",
        ),
        Signature(
            id="F20.mismatch-error",
            exception="ValueError",
            pattern=r"Please correct the following DeepSpeed config values that mismatch TrainingArguments",
            description="the loud form: transformers refuses a DeepSpeed config whose explicit value differs "
            "from the TrainingArguments' (each listed as '- ds KEY=V vs hf ARG=V')",
        ),
    ),
    expectations=(
        Expectation(
            "bug",
            Outcome.REPRODUCED,
            {"accelerate": "<1.8.0"},
            established_by=_ESTABLISHED,
            under=(TF4_ACC_1_7,),
            observed={"accelerate": ("1.7.0",)},
            established_on="cpu",
        ),
        Expectation(
            "bug",
            Outcome.NOT_REPRODUCED,
            {"accelerate": ">=1.8.0"},
            established_by=_ESTABLISHED,
            under=(TF4, CURRENT),
            observed={"accelerate": ("1.8.0", "1.8.1", "1.10.0", "1.13.0", "1.15.0")},
            established_on="cpu",
        ),
        Expectation("fixed", Outcome.PASS, {}, established_by=_ESTABLISHED),
    ),
    depends_on=("torch", "deepspeed", "peft", "transformers", "accelerate"),
    depends_on_why=(
        "transformers' Trainer hands the TrainingArguments to accelerate's DeepSpeed wrapper and DeepSpeed's engine, "
        "training peft's adapters on torch; nothing is quantized"
    ),
    description=__doc__ or "",
)


def run(ctx: RankContext) -> None:
    from repros.trainer.fixed_trainer import train
    from repros.trainer.scenario import Scenario
    from repros.trainer.variants import scenario_for

    scenario = Scenario(
        engine="deepspeed",
        zero_stage=2,
        bf16=True,
        gradient_checkpointing=False,
        trainer_loop="hf",
        gradient_accumulation_steps=GRADIENT_ACCUMULATION_STEPS,
        ds_config_omits=("gradient_accumulation_steps",),
    )
    scenario, guards = scenario_for(ctx, SPEC, scenario)
    train(scenario, ctx, guards)
    raise_if_disagrees(ctx.facts["deepspeed_settings"], ctx.rank)


# The fixed trainer's workaround of this failure: chosen by repros/trainer/guards.py (in its order), listed in
# docs/guards.md.
GUARD = GuardRule(
    "ds-config-auto",
    "F20",
    lambda s, v: s.engine == "deepspeed" and s.trainer_loop == "hf" and bool(s.ds_config_omits),
    {"ds_config_omits": ()},
    lambda v: (
        "a DeepSpeed config that leaves out a value the TrainingArguments also set trains with DeepSpeed's "
        "default, silently (F20); write every shared value as 'auto'"
    ),
    explained=(
        "a DeepSpeed config that leaves out a value the ``TrainingArguments`` set too (gradient accumulation, "
        "micro batch, clipping, the scheduler's peak learning rate) trains with DeepSpeed's or accelerate's "
        "default, and nothing says so (F20; an explicit conflicting value is refused by transformers): write "
        'every shared value as ``"auto"``.'
    ),
)
