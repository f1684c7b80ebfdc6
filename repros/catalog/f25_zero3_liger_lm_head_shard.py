"""F25 - TRL's GRPO with Liger's fused loss under ZeRO-3: ``size mismatch, got input (...), vec (0)`` (CUDA).

With ``use_liger_kernel=True`` TRL's GRPO computes its loss with Liger's fused linear + GRPO loss, which takes the
last hidden states and the language-model head's weight and never materializes the logits. TRL passes
``unwrapped_model.lm_head.weight`` to it directly, outside the model's forward: under ZeRO-3 that parameter is a
partition placeholder whose gather hook never fired, so the fused matmul gets an empty tensor and fails
(``RuntimeError: size mismatch, got input (s2x2048), vec (0)`` in the reports; TRL#3368, #4544). TRL PR #5891
(1.6.0) gathers ``lm_head`` around the call for GRPO; PR #6372 (1.9.0) does the same for DPO and KTO.

It cannot run on a CPU: Liger's kernels are Triton kernels, which run on GPUs only (no CPU backend). On a CPU both
modes are INFRA with that reason (decided before anything is imported, so a cell without liger or trl says the
same); on a GPU runner a cell with trl and liger-kernel installed runs them for real. Not run on a GPU here (this
task was lent none): the CUDA outcomes have no expectation yet, and what a runner sees is the finding.

bug:   TRL's ``GRPOTrainer`` on the tiny Qwen2 (the F18 recipe: a word-level tokenizer, a plain reward function,
       2 generations of 6 tokens), ``use_liger_kernel=True``, no reference model (``beta=0``), DeepSpeed ZeRO-3
       (every parameter partitioned) from ``GRPOConfig(deepspeed=...)``.
fixed: the same through the fixed trainer's guards (``liger-loss-off-under-zero3`` on trl < 1.6.0: GRPO without
       Liger's loss).
"""

from __future__ import annotations

from packaging.version import Version

from repros.catalog._stacks import CURRENT
from repros.runtime.context import RankContext
from repros.runtime.outcomes import Outcome
from repros.runtime.record import ScenarioUnavailable
from repros.runtime.spec import Expectation, ReproSpec, Signature
from repros.trainer.guards import GuardRule
from repros.trainer.scenario import Scenario

SCENARIO = Scenario(
    engine="deepspeed",
    zero_stage=3,
    zero3_persistence_threshold=0,
    bf16=False,
    gradient_checkpointing=False,
    trainer_loop="hf",
    liger_loss=True,
)

#: Why a CPU run is INFRA (the item's reason and the expectation's note).
CPU_REASON = "F25 needs CUDA: Liger's fused linear + loss kernels are Triton kernels, which have no CPU backend"

_CPU = (
    "python -m harness run --cells current-cuda-only --repros F25 (2026-11-27, torch 2.13.0+cpu): bug INFRA, fixed "
    "INFRA; the fix's boundary read from TRL's history (PR #5891 first in v1.6.0)"
)

SPEC = ReproSpec(
    id="F25",
    title="TRL GRPO with Liger's fused loss under ZeRO-3: lm_head read as an empty shard (CUDA)",
    upstream=(
        "huggingface/trl#3368",
        "huggingface/trl#4544",
        "huggingface/trl PR #5891 (fix for GRPO: lm_head gathered around Liger's loss; 1.6.0)",
        "huggingface/trl PR #6372 (the same for DPO and KTO; 1.9.0)",
    ),
    signatures=(
        Signature(
            id="F25.liger-empty-lm-head",
            exception="RuntimeError",
            pattern=r"size mismatch, got input \(\w*\d+x\d+\), vec \(0\)",
            description="Liger's fused linear loss multiplies by lm_head.weight as ZeRO-3 left it outside the "
            "forward: an empty shard (raised in the kernel's matmul, before any collective: the same wording on "
            "NCCL and gloo)",
        ),
    ),
    expectations=(
        Expectation("bug", Outcome.INFRA, {}, established_by=_CPU, note=CPU_REASON, device="cpu", under=(CURRENT,)),
        Expectation("fixed", Outcome.INFRA, {}, established_by=_CPU, note=CPU_REASON, device="cpu"),
    ),
    pass_rule="clean-exit",
    depends_on=("torch", "deepspeed", "transformers", "accelerate", "trl", "liger-kernel"),
    depends_on_why=(
        "TRL's GRPO trainer (transformers' Trainer, through accelerate) hands Liger's fused loss (liger-kernel, "
        "Triton on torch) the lm_head weight ZeRO-3 (deepspeed) partitioned; GRPO trains the whole model, so peft "
        "takes no part, and nothing is quantized"
    ),
    description=__doc__ or "",
)


def run(ctx: RankContext) -> None:
    if ctx.device_type != "cuda":
        raise ScenarioUnavailable(CPU_REASON)
    from importlib import metadata

    from repros.trainer.grpo import train_grpo
    from repros.trainer.guards import apply_guards
    from repros.trainer.variants import scenario_for

    for package in ("trl", "liger-kernel"):
        try:
            ctx.facts[package] = metadata.version(package)
        except metadata.PackageNotFoundError as exc:
            raise ScenarioUnavailable(
                f"{package} is not installed in this cell (F25 trains TRL's GRPO with Liger)"
            ) from exc
    scenario, guards = scenario_for(ctx, SPEC, SCENARIO)
    effective = apply_guards(scenario, guards)
    ctx.facts["guards"] = [{"id": g.id, "reason": g.reason} for g in guards]
    train_grpo(ctx, effective, beta=0.0, use_liger_kernel=effective.liger_loss)


# The fixed trainer's workaround of this failure: chosen by repros/trainer/guards.py (in its order), listed in
# docs/guards.md.
#: TRL PR #5891 (1.6.0): GRPO gathers ``lm_head`` under ZeRO-3 before Liger's fused loss reads it (DPO/KTO: PR #6372,
#: 1.9.0). Read from TRL's history; F25 needs CUDA (repros/catalog/f25_zero3_liger_lm_head_shard.py).
TRL_GRPO_LIGER_ZERO3_GATHER = Version("1.6.0")

GUARD = GuardRule(
    "liger-loss-off-under-zero3",
    "F25",
    lambda s, v: (
        s.liger_loss
        and s.engine == "deepspeed"
        and s.zero_stage == 3
        and (trl := v.get("trl")) is not None
        and trl < TRL_GRPO_LIGER_ZERO3_GATHER
    ),
    {"liger_loss": False},
    lambda v: (
        f"trl {v.get('trl')} < {TRL_GRPO_LIGER_ZERO3_GATHER} hands Liger's fused loss lm_head.weight as ZeRO-3 "
        "left "
        "it (an empty shard: 'size mismatch ... vec (0)', F25, TRL#3368, PR #5891): train GRPO without Liger's "
        "loss (the full logits are materialized: more activation memory)"
    ),
    explained=(
        "TRL before 1.6.0 (GRPO; DPO and KTO before 1.9.0) passes Liger's fused linear loss "
        "``unwrapped_model.lm_head.weight`` itself, outside the model's forward, so ZeRO-3's gather hook never "
        "fires and the kernel multiplies with an empty shard (``size mismatch, got input (...), vec (0)``; F25, "
        "TRL#3368/#4544, PR #5891): train without Liger's loss (the logits materialized whole: more activation "
        "memory)."
    ),
)
