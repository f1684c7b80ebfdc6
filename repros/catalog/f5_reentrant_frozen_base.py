"""F5 - reentrant checkpointing with a frozen base, only LoRA trainable (DeepSpeed-Chat).

With reentrant checkpointing, a checkpointed block's output requires grad only if one of
its inputs does. With the embedding frozen (only LoRA trainable) no block input does, so
the adapters inside the blocks get no gradient: the loss has no grad_fn and backward
raises, or, when something outside the blocks is trainable, training runs with the layer
adapters silently untouched. DeepSpeed-Chat asserted against the combination until
DeepSpeedExamples PR #658 added ``enable_input_require_grads``; transformers 5 defaults to
non-reentrant checkpointing.

bug:   DeepSpeed-Chat's flow: tiny Qwen2, its own LoRA layers (``convert_linear_layer_to_lora``)
       on every linear layer in the decoder, ``only_optimize_lora_parameters``,
       ``gradient_checkpointing_enable()`` with no arguments (the library's default), ZeRO-2,
       bf16, a torch AdamW.
fixed: the same scenario through the fixed trainer's guards.

Not F5: DeepSpeed#3339 raises the same RuntimeError with zero trainable parameters and no
checkpointing; the signatures look at the failing rank's scenario facts to tell them apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from repros.catalog._stacks import CURRENT, DS_0_19_2, TF4, TF4_DS_0_18
from repros.catalog._surveyed import TRANSFORMERS_5, surveyed
from repros.runtime.context import RankContext
from repros.runtime.outcomes import Outcome
from repros.runtime.spec import Diverges, Expectation, ReproSpec, Signature, Variant
from repros.trainer.guards import GuardRule, checkpoints_reentrantly
from repros.trainer.scenario import Scenario

DECODER_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

# Established by running (2026-11-23, torch 2.13.0+cpu, 2 ranks, gloo): transformers 4.57.6
# REPRODUCED with deepspeed 0.19.8 (its loss assertion) and 0.18.0 (torch's RuntimeError:
# 0.18.0 is the last release without the assertion, read from the sdists 0.18.0..0.19.0),
# transformers 5.23.0 NOT_REPRODUCED; bisect put the boundary at 5.0.0.
_ESTABLISHED = (
    "python -m harness run --matrix M --repros F5, M = matrix.yaml's defaults with cells transformers==4.57.6, "
    "transformers==4.57.6 + deepspeed==0.18.0, current; then python -m harness bisect --repro F5 --package "
    "transformers --good 5.23.0 --bad 4.57.6 --matrix M --cell tf4 -> first good: transformers==5.0.0 "
    "(7 steps: 4.57.6 REPRODUCED; 5.0.0, 5.1.0, 5.4.0, 5.5.4, 5.11.0, 5.23.0 NOT_REPRODUCED)"
)


def frozen_base_under_reentrant_checkpointing(facts: Mapping[str, Any]) -> bool:
    """The failing run had trainable adapters, a frozen embedding, reentrant checkpointing
    and no input grads: F5's cause, not DeepSpeed#3339's (nothing trainable at all)."""
    return (
        int(facts.get("trainable_parameters") or 0) > 0
        and facts.get("frozen_embedding") is True
        and facts.get("checkpointing") == "reentrant"
        and facts.get("input_require_grads") is False
    )


#: The documented configuration (DeepSpeed-Chat's flow; ``fixed`` runs it through the guards).
SCENARIO = Scenario(
    engine="deepspeed",
    zero_stage=2,
    lora_impl="dschat",
    target_modules=DECODER_LINEARS,
    gradient_checkpointing=True,
    use_reentrant=None,
)

DEPENDS_ON = ("torch", "deepspeed", "transformers")

SPEC = ReproSpec(
    id="F5",
    title="Reentrant checkpointing + frozen base, only LoRA trainable: no gradient",
    upstream=(
        "microsoft/DeepSpeedExamples#386",
        "microsoft/DeepSpeedExamples#625",
        "microsoft/DeepSpeedExamples PR #658 (fix: make_model_gradient_checkpointing_compatible)",
        "huggingface/transformers#42489",
        "deepspeedai/DeepSpeed#3339 (confounder: zero trainable parameters, not F5)",
    ),
    signatures=(
        Signature(
            id="F5.no-grad-fn",
            exception="RuntimeError",
            pattern=r"element 0 of tensors does not require grad and does not have a grad_fn",
            facts_checks=(frozen_base_under_reentrant_checkpointing,),
            description="backward on a loss with no grad_fn, adapters trainable, reentrant checkpointing",
        ),
        Signature(
            id="F5.deepspeed-loss-assert",
            exception="AssertionError",
            pattern=r"^loss must be a scalar tensor",
            facts_checks=(frozen_base_under_reentrant_checkpointing,),
            description="DeepSpeed's engine refuses the loss (no grad_fn) before backward",
        ),
        Signature(
            id="F5.silent-layer-adapters-no-grad",
            exception="repros.trainer.silent_failures.LayerAdaptersGotNoGradient",
            # Its name before the worker side was split (logs of earlier harness versions).
            aliases=("repros.common.silent_failures.LayerAdaptersGotNoGradient",),
            pattern=r"^layer adapters got no gradient",
            facts_checks=(frozen_base_under_reentrant_checkpointing,),
            description="no error, but every adapter inside the decoder layers had grad None at every step",
        ),
    ),
    expectations=(
        # The surveyed stacks first: a run of one of them is compared with what was seen there.
        # The surveyed stacks with transformers 5 have none of it.
        *surveyed(DEPENDS_ON, otherwise=dict.fromkeys(TRANSFORMERS_5, Outcome.NOT_REPRODUCED)),
        Expectation(
            "bug",
            Outcome.REPRODUCED,
            {"transformers": "<5.0.0"},
            established_by=_ESTABLISHED,
            under=(TF4, TF4_DS_0_18),
            observed={"transformers": ("4.57.6",)},
            established_on="cpu",
        ),
        Expectation(
            "bug",
            Outcome.NOT_REPRODUCED,
            {"transformers": ">=5.0.0"},
            established_by=_ESTABLISHED,
            under=(CURRENT, DS_0_19_2),
            observed={"transformers": ("5.0.0", "5.1.0", "5.4.0", "5.5.4", "5.11.0", "5.23.0")},
            established_on="cpu",
        ),
        Expectation("fixed", Outcome.PASS, {}, established_by=_ESTABLISHED),
    ),
    depends_on=DEPENDS_ON,
    depends_on_why=(
        "DeepSpeed-Chat's flow: its own LoRA layers (not peft's) under ZeRO-2, checkpointed reentrantly by "
        "transformers' default, on torch's autograd; accelerate and bitsandbytes take no part"
    ),
    description=__doc__ or "",
    # Any strategy checkpointing reentrantly over peft's LoRA with the embedding frozen: its backward finds no
    # grad_fn where transformers before 5 leaves the inputs without grad (crosscheck trains as users write it).
    diverges=(
        Diverges(
            ("*-ckpt-re*",),
            {"transformers": "<5.0.0"},
            "python -m harness crosscheck --cells tf4-ds-0.18.0,tf4-ds-0.17.6 --strategies <the 42 of the ci lane, "
            "the pairwise cover and nine with AdamW> (2026-11-29, torch 2.13.0+cpu, transformers 4.57.6, 2 ranks, "
            "gloo): every strategy with reentrant checkpointing raised F5's RuntimeError on each rank; the same "
            "strategies agree with transformers 5.23.0",
        ),
    ),
    variants=(
        Variant(
            "non-reentrant",
            "non-reentrant checkpointing (use_reentrant=False)",
            {"use_reentrant": False},
            claim="huggingface/transformers#42489; transformers 5's default",
        ),
        Variant(
            "no-checkpointing",
            "gradient checkpointing off",
            {"gradient_checkpointing": False},
            claim="DeepSpeedExamples#386 (the assertion's advice)",
        ),
    ),
)


def run(ctx: RankContext) -> None:
    from repros.trainer.fixed_trainer import train
    from repros.trainer.silent_failures import raise_if_layer_adapters_got_no_gradient
    from repros.trainer.variants import scenario_for

    scenario, guards = scenario_for(ctx, SPEC, SCENARIO)
    train(scenario, ctx, guards)
    if ctx.mode == "bug":
        raise_if_layer_adapters_got_no_gradient(ctx.facts["train"])


# The fixed trainer's workaround of this failure: chosen by repros/trainer/guards.py (in its order), listed in
# docs/guards.md.
def _peft_makes_inputs_require_grad(s: Scenario) -> bool:
    """``get_peft_model`` on a model already checkpointing calls ``enable_input_require_grads``
    itself (unquantized models; PEFT's ``_prepare_model_for_gradient_checkpointing``)."""
    return (
        s.gradient_checkpointing
        and s.checkpointing_before_adapter
        and s.lora_impl == "peft"
        and s.peft_wrapping == "peft_model"
        and not s.quantization
    )


GUARD = GuardRule(
    "input-require-grads",
    "F5",
    lambda s, v: (
        s.gradient_checkpointing
        and checkpoints_reentrantly(s, v)
        and not s.input_require_grads
        and not _peft_makes_inputs_require_grad(s)
    ),
    {"input_require_grads": True},
    lambda v: "reentrant checkpointing with a frozen embedding gives adapters no gradient (F5)",
    explained=(
        "under reentrant checkpointing with a frozen embedding no checkpointed block's input requires grad, so "
        "the adapters inside get none (F5); make the embedding output require grad (not when PEFT did so itself: "
        "checkpointing enabled before ``get_peft_model``)."
    ),
)
