"""F18 - ZeRO-3 with TRL's GRPO/RLOO and a reference model: ``IndexError: pop from an empty deque``.

transformers 5.0 .. 5.5.3 decorate each attention class with ``use_kernelized_func(apply_rotary_pos_emb)``:
at the end of its ``__init__`` every attention module gets ``self.rotary_fn``. With the ``kernels``
package installed ``apply_rotary_pos_emb`` is itself one ``nn.Module`` for the whole process
(``use_kernel_func_from_hub``), so every model built in the process (the policy and TRL's reference
model alike) holds that same module as a child, and every attention forward calls it. Under ZeRO-3
each DeepSpeed engine walks its model and registers hooks and a module id (``ds_id``) on every
module: the reference model's engine, built after the policy's, re-numbers the shared module and adds
its own hooks, which now fire in the policy's forwards as well as its own. A coordinator records its
trace by ``ds_id`` and rebuilds it at the start of the next forward (``reset_step``); with the shared
module in it that bookkeeping no longer adds up, and ``record_parameters`` pops a deque with nothing
in it: ``IndexError: pop from an empty deque`` in ``partitioned_param_coordinator.py``, here (as in
TRL#4899's RLOO traceback) in the reference model's forward for ``ref_per_token_logps`` after the
second step's generation. TRL's distributed tests showed it for GRPO and RLOO with ZeRO-3 from
transformers 5.0 on (TRL#4899, transformers#45137). The exact drift is read from DeepSpeed's code, not
measured; measured is that removing the shared child (the guard) trains, on the same stack.
transformers PR #45414 (5.5.4) no longer attaches the child under ZeRO-3.

Needs every piece: transformers 5.0 .. 5.5.3, the ``kernels`` package (without it ``rotary_fn`` is a
plain function: measured, GRPO trains), and a reference model (``beta > 0``, RLOO's default 0.05;
GRPO's default 0.0 builds none and trains; with a PEFT model the reference is the policy with its
adapter disabled, one engine). DeepSpeed 0.18.6 and 0.19.8 fail alike; RLOO (default ``beta`` 0.05) too.

bug:   TRL's ``GRPOTrainer`` (``beta=0.04``: a reference model) on the tiny Qwen2 saved as a checkpoint,
       full fine-tuning, DeepSpeed ZeRO-3 (every parameter partitioned) from ``GRPOConfig(deepspeed=...)``
       on a CPU (``use_cpu=True``, gloo), a plain Python reward function, a word-level tokenizer made
       here (no hub); 2 prompts per rank, 2 generations each, 6 new tokens.
fixed: the same with the fixed trainer's guards (``zero3-no-shared-rotary-fn`` on transformers < 5.5.4:
       no model keeps the ``rotary_fn`` child, as PR #45414 makes it).
"""

from __future__ import annotations

from packaging.version import Version

from repros.catalog._stacks import TRL_TF_5_5_3
from repros.runtime.context import RankContext
from repros.runtime.outcomes import Outcome
from repros.runtime.record import ScenarioUnavailable
from repros.runtime.spec import Expectation, ReproSpec, Signature, Variant
from repros.trainer.guards import GuardRule, Versions
from repros.trainer.scenario import Scenario

#: GRPO's KL coefficient: non-zero, so TRL builds the reference model (a second ZeRO-3 engine).
BETA = 0.04

# Established by running (2026-11-26, torch 2.13.0+cpu, deepspeed 0.19.8, trl 1.1.0, kernels 0.13.0, 2 ranks, gloo):
# bug REPRODUCED on transformers 5.5.3 (the second step's forward, rank 0 and 1), NOT_REPRODUCED on 5.5.4, fixed
# PASS on both; the same run with the cells on deepspeed 0.18.6 gave the same four outcomes; by hand (torchrun in the
# cell's environment): RLOO with its default beta 0.05 fails alike, and without kernels, or with GRPO's beta 0.0 (no
# reference model), GRPO trains; then the bisect below.
_ESTABLISHED = (
    "python -m harness run --cells tf-5.5.3-trl,tf-5.5.4-trl --repros F18 (2026-11-26); then python -m harness "
    "bisect --repro F18 --mode bug --package transformers --good 5.5.4 --bad 5.5.3 --cell tf-5.5.3-trl -> first "
    "good: transformers==5.5.4 (2 steps, 87 s)"
)

SPEC = ReproSpec(
    id="F18",
    title="ZeRO-3 with TRL's GRPO/RLOO and a reference model: pop from an empty deque (transformers 5.0 .. 5.5.3)",
    upstream=(
        "huggingface/trl#4899",
        "huggingface/transformers#45137",
        "huggingface/transformers PR #45414 (fix: no rotary_fn child under ZeRO-3; 5.5.4)",
        "huggingface/trl PR #5541 (TRL's ZeRO-3 GRPO/RLOO tests expected to fail on transformers 5.0 .. 5.5.3)",
    ),
    signatures=(
        Signature(
            id="F18.pop-from-empty-deque",
            exception="IndexError",
            pattern=r"^pop from an empty deque$",
            description="ZeRO-3's parameter coordinator rebuilding its trace at the start of a forward "
            "(record_parameters in reset_step): a module's recorded fetches are kept under another ds_id",
        ),
    ),
    expectations=(
        Expectation(
            "bug",
            Outcome.REPRODUCED,
            {"transformers": ">=5.0,<5.5.4"},
            established_by=_ESTABLISHED,
            under=(TRL_TF_5_5_3,),
            observed={"transformers": ("5.5.3",)},
            established_on="cpu",
        ),
        Expectation(
            "bug",
            Outcome.NOT_REPRODUCED,
            {"transformers": ">=5.5.4"},
            established_by=_ESTABLISHED,
            under=(TRL_TF_5_5_3,),
            observed={"transformers": ("5.5.4",)},
            established_on="cpu",
        ),
        Expectation("fixed", Outcome.PASS, {}, established_by=_ESTABLISHED),
    ),
    variants=(
        Variant(
            "no-rotary-fn",
            "the fixed trainer's guard alone, on any transformers: no model keeps the rotary_fn child",
            {"zero3_no_kernel_func_children": True},
            claim="transformers PR #45414 leaves the child out under ZeRO-3 from 5.5.4 on",
        ),
    ),
    pass_rule="clean-exit",
    depends_on=("torch", "deepspeed", "peft", "transformers", "accelerate", "trl", "kernels"),
    depends_on_why=(
        "TRL's trainer (through accelerate) builds two ZeRO-3 (deepspeed) engines over transformers models whose "
        "attention holds the kernels package's rotary_fn, with peft's adapters, on torch; nothing is quantized"
    ),
    description=__doc__ or "",
)


def run(ctx: RankContext) -> None:
    import dataclasses
    from importlib import metadata

    from repros.trainer.guards import apply_guards
    from repros.trainer.scenario import Scenario
    from repros.trainer.variants import scenario_for

    try:
        ctx.facts["trl"] = metadata.version("trl")
    except metadata.PackageNotFoundError as exc:
        raise ScenarioUnavailable("trl is not installed in this cell (F18 trains with TRL's GRPOTrainer)") from exc
    try:
        ctx.facts["kernels"] = metadata.version("kernels")
    except metadata.PackageNotFoundError:
        ctx.facts["kernels"] = None
    scenario = Scenario(
        engine="deepspeed",
        zero_stage=3,
        zero3_persistence_threshold=0,
        bf16=False,
        gradient_checkpointing=False,
        trainer_loop="hf",
    )
    scenario, guards = scenario_for(ctx, SPEC, scenario)
    effective = apply_guards(scenario, guards)
    ctx.facts["guards"] = [{"id": g.id, "reason": g.reason} for g in guards]
    ctx.facts["scenario_facts"] = {
        k: v for k, v in dataclasses.asdict(effective).items() if isinstance(v, bool | int | float | str)
    }
    if effective.zero3_wait_every_gather:
        from repros.trainer.zero3_gathers import wait_on_every_gather

        wait_on_every_gather()
    if effective.zero3_no_kernel_func_children:
        from repros.trainer.kernel_funcs import drop_kernel_func_children

        drop_kernel_func_children()
    from repros.trainer.grpo import train_grpo

    train_grpo(ctx, effective, beta=BETA)


# The fixed trainer's workaround of this failure: chosen by repros/trainer/guards.py (in its order), listed in
# docs/guards.md.
#: transformers 5.0 .. 5.5.3 attach one shared ``rotary_fn`` module to every attention module (with the
#: ``kernels`` package installed); PR #45414 (5.5.4) leaves it out under ZeRO-3 (F18, TRL#4899).
TRANSFORMERS_Z3_KERNEL_FUNC_CHILD = (Version("5.0.0.dev0"), Version("5.5.4"))


def _zero3_shared_kernel_func(s: Scenario, v: Versions) -> bool:
    transformers = v.get("transformers")
    low, high = TRANSFORMERS_Z3_KERNEL_FUNC_CHILD
    return (
        s.engine == "deepspeed"
        and s.zero_stage == 3
        and not s.zero3_no_kernel_func_children
        and transformers is not None
        and low <= transformers < high
    )


GUARD = GuardRule(
    "zero3-no-shared-rotary-fn",
    "F18",
    _zero3_shared_kernel_func,
    {"zero3_no_kernel_func_children": True},
    lambda v: (
        f"transformers {v.get('transformers')} (< {TRANSFORMERS_Z3_KERNEL_FUNC_CHILD[1]}) gives every model's "
        "attention one shared rotary_fn module; a policy's and a reference model's ZeRO-3 engines both "
        "register it and a trace breaks ('pop from an empty deque', F18, TRL#4899, transformers PR #45414)"
    ),
    explained=(
        "transformers 5.0 .. 5.5.3 with the ``kernels`` package wrap ``apply_rotary_pos_emb`` in one "
        "``nn.Module`` and attach it to every attention module of every model as ``rotary_fn``; under ZeRO-3 a "
        "policy's and a reference model's engines (TRL's GRPO/RLOO with ``beta > 0``) both register that one "
        "module, and on DeepSpeed before its trace fixes the policy's trace pops an empty deque (F18, TRL#4899): "
        "leave the child out, as transformers PR #45414 (5.5.4) does under ZeRO-3."
    ),
)
