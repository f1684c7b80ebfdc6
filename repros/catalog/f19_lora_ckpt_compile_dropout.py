"""F19 - LoRA with dropout + activation checkpointing + ``torch.compile``: inductor cannot compile the backward (CUDA).

A PEFT LoRA layer with ``lora_dropout > 0`` applies ``nn.Dropout`` to its input; under non-reentrant
activation checkpointing the backward recomputes the layer, dropout mask included, and inductor fuses
that recomputed mask with the RMSNorm around it into one Triton kernel
(``triton_per_fused__to_copy_add_mean_mul_native_dropout_pow_rsqrt_0``). Triton's MLIR pipeline rejects
it ("error: operand #0 does not dominate this use" in ``TritonGPURemoveLayoutConversions``) and inductor
raises ``InductorError: RuntimeError: PassManager::run failed`` (or, when it compiled in a worker
process, ``InductorError: SubprocException: An exception occurred in a subprocess`` around the same
error) in the first backward. Dropout 0 (PEFT's ``nn.Identity``), no checkpointing, or no compile
train. Reported on torch 2.8.0+cu129 (peft#3020, LLaVA with accelerate's regional compilation);
observed here on an H200 with torch 2.11.0+cu130, transformers 5.17.0, peft 0.21.0 (a tiny Llama, one
process), bf16 and float32 alike; no torch release is known to fix it. torch 2.12 and 2.13 on CUDA are
not known either way: the bug mode has no expectation there, so a GPU runner's outcome is a finding.

It cannot occur on a CPU: there inductor emits C++/OpenMP, not Triton, and the same scenario trains
(tried 2026-11-26 with torch 2.8.0, 2.10.0 and 2.13.0, full and regional compilation; and this scenario,
single-process, through the fixed trainer with inductor on torch 2.13.0: two steps, 74 s of compiling). On
a CPU both modes are INFRA with that reason; a GPU runner runs them for real.

bug:   tiny Qwen2, LoRA r=8 on q/v with ``lora_dropout=0.1`` by ``get_peft_model``, non-reentrant
       checkpointing, DDP, the DDP model compiled with ``torch.compile`` (inductor), bf16 autocast, the
       fixed trainer's loop (the error comes in the first backward).
fixed: the same scenario through the fixed trainer's guards (``lora-dropout-off-under-compile``: the
       adapters trained without dropout; its cost is regularization, not time).
"""

from __future__ import annotations

from repros.catalog._stacks import stack
from repros.runtime.context import RankContext
from repros.runtime.outcomes import Outcome
from repros.runtime.record import ScenarioUnavailable
from repros.runtime.spec import Expectation, ReproSpec, Signature, Variant
from repros.trainer.guards import GuardRule
from repros.trainer.scenario import Scenario

SCENARIO = Scenario(
    engine="ddp",
    bf16=True,
    gradient_checkpointing=True,
    use_reentrant=False,
    lora_dropout=0.1,
    compile_model=True,
)

#: Why a CPU run is INFRA (the item's reason and the expectation's note).
CPU_REASON = (
    "F19 needs CUDA: the failure is in Triton's compiler, which inductor uses only for GPU kernels; on a "
    "CPU inductor emits C++ and this scenario trains (torch 2.8.0, 2.10.0, 2.13.0 tried)"
)

# Established on an H200 (2026-11-26, torch 2.11.0+cu130, transformers 5.17.0, peft 0.21.0, one process, a
# tiny Llama, LoRA r=4 on q/v, non-reentrant checkpointing, torch.compile(model)); and on this machine's CPU.
_GPU = (
    "H200 script (torch 2.11.0+cu130, 2026-11-26): dropout 0.1 + checkpointing, bf16 and float32: InductorError "
    "'PassManager::run failed' (TORCHINDUCTOR_COMPILE_THREADS=1; with worker processes 'SubprocException'); "
    "dropout 0.1 without checkpointing: trains; dropout 0 with checkpointing: trains"
)
_CPU = (
    "CPU scripts (2026-11-26): torch 2.8.0, 2.10.0, 2.13.0, full and regional compile: every one trains; "
    "python -m harness run --cells current --repros F19: bug INFRA, fixed INFRA"
)

SPEC = ReproSpec(
    id="F19",
    title="LoRA dropout + activation checkpointing + torch.compile: inductor cannot compile the backward (CUDA)",
    upstream=(
        "huggingface/peft#3020",
        "triton-lang/triton: TritonGPURemoveLayoutConversions, 'operand #0 does not dominate this use'",
    ),
    signatures=(
        Signature(
            id="F19.passmanager-run-failed",
            exception="torch._inductor.exc.InductorError",
            pattern=r"PassManager::run failed",
            description="inductor's Triton compile of the recomputed LoRA dropout fails (in the process, or in a "
            "compile worker: SubprocException around the same error)",
        ),
    ),
    expectations=(
        Expectation("bug", Outcome.INFRA, {}, established_by=_CPU, note=CPU_REASON, device="cpu"),
        Expectation("fixed", Outcome.INFRA, {}, established_by=_CPU, note=CPU_REASON, device="cpu"),
        Expectation(
            "bug",
            Outcome.REPRODUCED,
            {"torch": ">=2.8.0,<2.12.0"},
            established_by=_GPU,
            device="cuda",
            under=(stack(torch="2.11.0"),),
            observed={"torch": ("2.11.0",)},
        ),
        Expectation("fixed", Outcome.PASS, {}, established_by=_GPU, device="cuda"),
    ),
    variants=(
        Variant(
            "no-checkpointing",
            "activation checkpointing off: the dropout mask is not recomputed (more activation memory)",
            {"gradient_checkpointing": False},
            claim="huggingface/peft#3020",
        ),
        Variant(
            "no-compile",
            "the model left uncompiled (eager speed)",
            {"compile_model": False},
            claim="huggingface/peft#3020; ace-step/ACE-Step-1.5 PR #640 (compile skipped with LoRA)",
        ),
    ),
    depends_on=("torch", "peft"),
    depends_on_why=(
        "the failure is in torch's inductor and the Triton compiler it ships with, lowering peft's LoRA dropout "
        "recomputed under torch's checkpoint; no engine of DeepSpeed or accelerate runs, nothing is quantized"
    ),
    description=__doc__ or "",
)


def run(ctx: RankContext) -> None:
    if ctx.device_type != "cuda":
        raise ScenarioUnavailable(CPU_REASON)
    from repros.trainer.fixed_trainer import train
    from repros.trainer.variants import scenario_for

    scenario, guards = scenario_for(ctx, SPEC, SCENARIO)
    train(scenario, ctx, guards)


# The fixed trainer's workaround of this failure: chosen by repros/trainer/guards.py (in its order), listed in
# docs/guards.md.
GUARD = GuardRule(
    "lora-dropout-off-under-compile",
    "F19",
    lambda s, v: s.compile_model and s.gradient_checkpointing and s.lora_dropout > 0,
    {"lora_dropout": 0.0},
    lambda v: (
        f"torch {v.get('torch')}: inductor's Triton pipeline fails on a LoRA dropout recomputed under "
        "checkpointing in a compiled model ('PassManager::run failed', F19, peft#3020; no fix released): train "
        "the adapters without dropout (lora_dropout=0: less regularization)"
    ),
    explained=(
        "a compiled model (``torch.compile``, inductor) with LoRA dropout under activation checkpointing fails to "
        "compile on CUDA: Triton's MLIR pipeline rejects the kernel inductor makes of the dropout mask recomputed "
        'in the backward ("operand #0 does not dominate this use", ``InductorError: RuntimeError: '
        "PassManager::run failed``; F19, peft#3020); train the adapters without dropout. Its cost is "
        "regularization, not speed."
    ),
)
