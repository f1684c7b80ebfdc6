"""F11 - Trainer + DeepSpeed + LoRA without a DeepSpeed scheduler: the LR scheduler's strict zip.

transformers' ``Trainer`` puts the trainable parameters into two optimizer groups, with and without
weight decay. LoRA's adapters (``bias="none"``) all decay, so the no-decay group is empty. With no
``scheduler`` in the DeepSpeed config, transformers before 5.1.0 builds its own scheduler (a
``LambdaLR``, one lambda and one ``base_lr`` per group) on that optimizer *before* handing it to
DeepSpeed, whose engine then drops the empty group in place (``basic_optimizer.param_groups[:] =
[pg for pg in ... if len(pg["params"]) != 0]``, every ZeRO stage). torch 2.10 made the ``zip`` in
``LRScheduler._update_lr`` strict, so the first ``lr_scheduler.step()`` raises ``ValueError: zip()
argument 2 is longer than argument 1`` (older torch dropped the extra value silently). transformers
PR #43711 (5.1.0) builds the scheduler after ``accelerator.prepare``, on the optimizer DeepSpeed kept.

bug:   tiny Qwen2, LoRA r=8 on q/v by ``get_peft_model``, trained by transformers' ``Trainer`` with
       ``TrainingArguments(deepspeed=...)`` (ZeRO-2, bf16, sizes ``auto``, no optimizer and no
       scheduler section, so the Trainer's AdamW and its linear schedule; on a CPU ``use_cpu=True``).
fixed: the same scenario through the fixed trainer's guards (``drop-empty-param-groups``: the Trainer's
       optimizer drops its empty groups before the scheduler is built on it, as DeepSpeed would after).

transformers 5.1.0 itself (PR #43711's first form) no longer builds a scheduler before
``accelerator.prepare``, but then prepares the model and optimizer only where DeepSpeed's config names
a scheduler (a ``DummyScheduler``): without one nothing is prepared and the first backward fails
(``AttributeError: 'NoneType' object has no attribute 'backward'``, accelerate's
``deepspeed_engine_wrapped``), a ``DIFFERENT_ERROR`` here; 5.2.0 prepares them either way (both
bisected, see ``_ESTABLISHED``). The torch side (strict from 2.10 on) is read in torch's source and the
upstream threads; the matrix has no DeepSpeed cell with an older torch, so it was not run here.

The ZeRO stage does not matter (the engine drops empty groups for all of them; the upstream threads
saw ZeRO-2, ZeRO-3 and ZeRO++, and OpenRLHF's own loop with ZeRO-0); ZeRO-2 is the cheapest here. A
DeepSpeed ``scheduler`` section (``WarmupLR``, as HF's DeepSpeed guide writes) avoids it too: that
variant is priced as ``deepspeed-warmuplr``.
"""

from __future__ import annotations

from packaging.version import Version

from repros.catalog._stacks import CURRENT, TF4
from repros.runtime.context import RankContext
from repros.runtime.outcomes import Outcome
from repros.runtime.spec import Expectation, ReproSpec, Signature, Variant
from repros.trainer.guards import GuardRule

# Established by running (2026-11-26, torch 2.13.0+cpu, deepspeed 0.19.8, peft 0.21.2, accelerate 1.15.0, 2 ranks,
# gloo): tf4 (transformers 4.57.6) REPRODUCED, current (5.23.0) NOT_REPRODUCED, fixed PASS in both; the bisect named
# 5.1.0 the first release without the strict-zip error (5.0.0 REPRODUCED), but 5.1.0 fails otherwise (its
# AttributeError, see the docstring); a second bisect named 5.2.0 the first that trains (5.3.0 .. 5.23.0 too).
_ESTABLISHED = (
    "python -m harness run --cells tf4,current --repros F11 --jobs 1 (2026-11-26); python -m harness bisect --repro "
    "F11 --mode bug --package transformers --good 5.1.0 --bad 4.57.6 --cell tf4 -> first good: transformers==5.1.0 "
    "(3 steps: 4.57.6 and 5.0.0 REPRODUCED, 5.1.0 DIFFERENT_ERROR, 139 s); python -m harness bisect --repro F11 "
    "--mode bug --package transformers --good 5.23.0 --bad 5.1.0 --cell tf4 -> first good: transformers==5.2.0 "
    "(7 steps, 858 s)"
)

SPEC = ReproSpec(
    id="F11",
    title="Trainer + DeepSpeed + LoRA without a DeepSpeed scheduler: the LR scheduler's strict zip",
    upstream=(
        "huggingface/transformers PR #43692 (report and first fix, closed for #43711)",
        "huggingface/transformers PR #43711 (fix: the scheduler built after the optimizer is prepared; 5.1.0)",
        "OpenRLHF/OpenRLHF#1225 / PR #1234 (the same with OpenRLHF's own loop)",
        "hiyouga/LlamaFactory#10141, #10144",
        "modelscope/ms-swift#8299 (ZeRO-2 + LoRA, torch 2.10, the same step)",
        "MakazhanAlpamys/Soup#336",
        "deepspeedai/DeepSpeed PR #4277 (the engine drops empty parameter groups)",
        "deepspeedai/DeepSpeedExamples PR #756 (the same mismatch, silent on older torch)",
    ),
    signatures=(
        Signature(
            id="F11.strict-zip-param-groups",
            exception="ValueError",
            pattern=r"zip\(\) argument 2 is longer than argument 1",
            description="torch >= 2.10's LRScheduler._update_lr: the scheduler has a learning rate for more "
            "parameter groups than the optimizer DeepSpeed kept (it dropped the empty no-decay group)",
        ),
    ),
    expectations=(
        Expectation(
            "bug",
            Outcome.REPRODUCED,
            {"transformers": "<5.1.0", "torch": ">=2.10"},
            established_by=_ESTABLISHED,
            under=(TF4,),
            observed={"transformers": ("4.57.6", "5.0.0"), "torch": ("2.13.0",)},
            established_on="cpu",
        ),
        Expectation(
            "bug",
            Outcome.DIFFERENT_ERROR,
            {"transformers": "==5.1.0"},
            established_by=_ESTABLISHED,
            note="5.1.0 prepares the model and optimizer only beside a DeepSpeed scheduler: without one the first "
            "backward finds no engine (\"'NoneType' object has no attribute 'backward'\"); 5.2.0 prepares them "
            "either way",
            under=(TF4,),
            observed={"transformers": ("5.1.0",)},
            established_on="cpu",
        ),
        Expectation(
            "bug",
            Outcome.NOT_REPRODUCED,
            {"transformers": ">=5.2.0"},
            established_by=_ESTABLISHED,
            under=(CURRENT, TF4),
            observed={"transformers": ("5.2.0", "5.23.0")},
            established_on="cpu",
        ),
        Expectation("fixed", Outcome.PASS, {}, established_by=_ESTABLISHED),
    ),
    variants=(
        Variant(
            "deepspeed-warmuplr",
            "a WarmupLR scheduler section in the DeepSpeed config (DeepSpeed's scheduler, not the Trainer's)",
            {"deepspeed_scheduler": True},
            claim="HF's DeepSpeed guide writes a scheduler section with 'auto' values",
        ),
    ),
    depends_on=("torch", "deepspeed", "peft", "transformers", "accelerate"),
    depends_on_why=(
        "transformers' Trainer builds its scheduler (through accelerate) on the optimizer DeepSpeed prunes, for "
        "peft's adapters, and torch's scheduler zips the groups; nothing is quantized"
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
        deepspeed_scheduler=False,
    )
    scenario, guards = scenario_for(ctx, SPEC, scenario)
    train(scenario, ctx, guards)


# The fixed trainer's workaround of this failure: chosen by repros/trainer/guards.py (in its order), listed in
# docs/guards.md.
#: First transformers release that builds the Trainer's own scheduler after DeepSpeed has taken the
#: optimizer (PR #43711). Established by running F11 (see repros/catalog/f11_trainer_scheduler_param_groups.py).
TRANSFORMERS_SCHEDULER_AFTER_PREPARE = Version("5.1.0")

GUARD = GuardRule(
    "drop-empty-param-groups",
    "F11",
    lambda s, v: (
        s.engine == "deepspeed"
        and s.trainer_loop == "hf"
        and not s.deepspeed_scheduler
        and not s.drop_empty_param_groups
        and (transformers := v.get("transformers")) is not None
        and transformers < TRANSFORMERS_SCHEDULER_AFTER_PREPARE
    ),
    {"drop_empty_param_groups": True},
    lambda v: (
        f"transformers {v.get('transformers')} < {TRANSFORMERS_SCHEDULER_AFTER_PREPARE} builds its scheduler "
        "before DeepSpeed drops the empty no-decay group of a LoRA model; torch >= 2.10's strict zip then "
        "raises (F11, transformers PR #43711)"
    ),
    explained=(
        "transformers before 5.1.0 builds the ``Trainer``'s own scheduler (none in the DeepSpeed config) on its "
        "optimizer's two parameter groups before DeepSpeed drops the empty no-decay group of a LoRA model; torch "
        ">= 2.10's strict ``zip`` in ``LRScheduler`` raises at step 1 (F11, transformers PR #43711): drop the "
        "empty groups before the scheduler is built."
    ),
)
