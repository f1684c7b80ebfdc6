"""F26 - Ulysses / ALST sequence parallelism with a PEFT model: ``expected str ... not PeftModel``.

DeepSpeed's Ulysses sequence parallelism for transformers (ALST) starts with
``UlyssesSPAttentionHF.register_with_transformers(model_name_or_path=..., ...)``: it builds the
sequence-parallel groups and needs the model's config (heads, layers). Before PR #7737 (0.18.4) it takes
its argument for a model only when ``isinstance(model_name_or_path, PreTrainedModel)`` and otherwise hands
it to ``AutoConfig.from_pretrained`` as a name or path. A LoRA model (``get_peft_model``'s ``PeftModel``)
is not a ``PreTrainedModel``, so the config lookup raises ``TypeError: expected str, bytes or os.PathLike
object, not PeftModel`` (``os.fspath`` inside transformers' hub lookup, as reported; with transformers 5.23 it is
``os.stat``'s ``path should be string, bytes, os.PathLike or integer, not PeftModelForCausalLM``) before anything
trains:
every user of the integrations that pass the model they hold (accelerate's ``_prepare_deepspeed``,
accelerate#3889; transformers' ``Trainer`` with ``parallelism_config``; DeepSpeed#7728) meets it with a
PEFT model. PR #7737 accepts any object with a ``config``.

The sequence-parallel degree is the item's world size (one Ulysses group of every rank): it needs two
ranks at least, which is what sequence parallelism is.

bug:   tiny Qwen2, LoRA r=8 on q/v by ``get_peft_model``, float32, ZeRO-3, Ulysses over every rank as the
       ALST tutorial writes it (``repros/trainer/ulysses.py``), the PEFT model registered.
fixed: the same through the fixed trainer's guards (``ulysses-register-base-model`` on deepspeed < 0.18.4:
       the transformers model inside the PEFT model registered; free), trained with Ulysses on gloo.
"""

from __future__ import annotations

from packaging.version import Version

from repros.catalog._stacks import CURRENT, SP_DS_0_18_1, SP_DS_0_18_3, stack
from repros.runtime.context import RankContext
from repros.runtime.outcomes import Outcome
from repros.runtime.spec import Expectation, ReproSpec, Signature, WorldSizes
from repros.trainer.guards import GuardRule, Versions
from repros.trainer.scenario import Scenario

SCENARIO = Scenario(
    engine="deepspeed",
    zero_stage=3,
    bf16=False,
    gradient_checkpointing=False,
    sequence_parallel=True,
    learning_rate=1e-2,
)

_ESTABLISHED = (
    "python -m harness run --cells sp-ds-0.18.1,sp-ds-0.18.3,current-new-paths --repros F26,F27 (2026-11-27); "
    "python -m harness bisect --repro F26 --mode bug --package deepspeed --good 0.18.4 --bad 0.18.3 "
    "--cell sp-ds-0.18.3 -> first good: deepspeed==0.18.4 (2 steps, 513 s)"
)

SPEC = ReproSpec(
    id="F26",
    title="Ulysses (ALST) sequence parallelism with a PEFT model: register_with_transformers takes it for a path",
    upstream=(
        "deepspeedai/DeepSpeed#7729",
        "deepspeedai/DeepSpeed#7728",
        "huggingface/accelerate#3889",
        "deepspeedai/DeepSpeed PR #7737 (fix: any model with a config is a model; 0.18.4)",
        "deepspeedai/DeepSpeed PR #7268 (0.17.0: Ulysses for transformers)",
    ),
    signatures=(
        Signature(
            id="F26.peft-model-as-path",
            exception="TypeError",
            pattern=r"(expected str, bytes or os\.PathLike object|path should be string, bytes, os\.PathLike or "
            r"integer), not PeftModel\w*",
            description="Ulysses' register_with_transformers hands a PEFT model to AutoConfig.from_pretrained as a "
            "name; os.fspath's wording (the reports) or os.stat's (transformers 5.23's lookup), raised before any "
            "collective: the same on NCCL and gloo",
        ),
    ),
    expectations=(
        Expectation(
            "bug",
            Outcome.REPRODUCED,
            {"deepspeed": ">=0.17.0,<0.18.4"},
            established_by=_ESTABLISHED,
            under=(SP_DS_0_18_1, SP_DS_0_18_3),
            observed={"deepspeed": ("0.18.1", "0.18.3")},
            established_on="cpu",
        ),
        # current-new-paths, and the bisect's good step (sp-ds-0.18.3 with deepspeed 0.18.4).
        Expectation(
            "bug",
            Outcome.NOT_REPRODUCED,
            {},
            established_by=_ESTABLISHED,
            under=(CURRENT, stack(deepspeed="0.18.4")),
            established_on="cpu",
        ),
        Expectation("fixed", Outcome.PASS, {}, established_by=_ESTABLISHED),
    ),
    world_sizes=WorldSizes(minimum=2),
    world_sizes_why="Ulysses splits the sequence across the ranks of its group: one rank is no sequence parallelism "
    "(register_with_transformers does nothing at degree 1)",
    depends_on=("torch", "deepspeed", "peft", "transformers"),
    depends_on_why=(
        "DeepSpeed's Ulysses registration takes peft's PeftModel for a name and hands it to transformers' config "
        "lookup, on torch's collectives; the repro drives DeepSpeed's engine itself, so accelerate takes no part, "
        "and nothing is quantized"
    ),
    description=__doc__ or "",
)


def run(ctx: RankContext) -> None:
    from repros.trainer.ulysses import train_ulysses
    from repros.trainer.variants import scenario_for

    scenario, guards = scenario_for(ctx, SPEC, SCENARIO)
    train_ulysses(scenario, ctx, guards)


# The fixed trainer's workaround of this failure: chosen by repros/trainer/guards.py (in its order), listed in
# docs/guards.md.
#: DeepSpeed PR #7737 (0.18.4): ``register_with_transformers`` takes any model with a ``config`` (a PEFT model),
#: not only a ``PreTrainedModel``. Bisected by F26 (repros/catalog/f26_ulysses_peft_register.py).
DEEPSPEED_ULYSSES_REGISTERS_PEFT_MODEL = Version("0.18.4")


def _ulysses_registers_peft_model(s: Scenario, v: Versions) -> bool:
    deepspeed = v.get("deepspeed")
    return (
        s.sequence_parallel
        and s.lora_impl == "peft"
        and s.peft_wrapping == "peft_model"
        and not s.ulysses_register_base_model
        and deepspeed is not None
        and deepspeed < DEEPSPEED_ULYSSES_REGISTERS_PEFT_MODEL
    )


GUARD = GuardRule(
    "ulysses-register-base-model",
    "F26",
    _ulysses_registers_peft_model,
    {"ulysses_register_base_model": True},
    lambda v: (
        f"deepspeed {v.get('deepspeed')} < {DEEPSPEED_ULYSSES_REGISTERS_PEFT_MODEL}: Ulysses' "
        "register_with_transformers "
        "takes a model that is not a PreTrainedModel (a PEFT model) for a name and hands it to AutoConfig (F26, "
        "DeepSpeed#7729, PR #7737): register the transformers model inside it"
    ),
    explained=(
        "DeepSpeed 0.17.0 .. 0.18.3's ``UlyssesSPAttentionHF.register_with_transformers`` takes its model "
        "argument for a model only when it is a ``PreTrainedModel``; a PEFT model (what accelerate's and "
        "transformers' ALST integration hand it) goes to ``AutoConfig.from_pretrained`` as a name (``TypeError: "
        "expected str, bytes or os.PathLike object, not PeftModel``; F26, DeepSpeed#7729, PR #7737): register the "
        "transformers model inside it (``get_base_model()``). Free."
    ),
)
