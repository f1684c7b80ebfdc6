"""F28 - accelerate's FSDP2 context parallelism skipped by the ``sp_backend`` check: no ``_cp_context`` (CUDA, 2+ GPUs).

accelerate 1.12.0 added DeepSpeed's Ulysses / ALST integration (PR #3817) and with it
``ParallelismConfig.sp_backend``, whose default and only value is ``"deepspeed"``. The same PR made
``Accelerator._prepare_cp`` (which builds ``self._cp_context``, torch's ``context_parallel`` over the mesh's ``cp``
dimension, and attaches its hooks) return at once ``if self.parallelism_config.sp_backend == "deepspeed"``,
which is always true: FSDP2 context parallelism (``cp_size > 1``) is never prepared, and the first
``with accelerator.maybe_context_parallel(...)`` raises ``AttributeError: 'Accelerator' object has no attribute
'_cp_context'`` (accelerate#3856; TRL's SFT with ``parallelism_config_cp_size: 2``, accelerate#3867). PR #3858
(1.13.0) removed the check.

It cannot run on a CPU: accelerate refuses a ``ParallelismConfig`` unless it runs FSDP2 on devices ("only
compatible DistributedType.FSDP (version 2) ... but got DistributedType.MULTI_CPU": tried 2026-11-27 with
accelerate 1.12.0, torch 2.13.0+cpu, 2 ranks on gloo), and torch's ``context_parallel`` shards attention only
through the SDPA flash and efficient kernels (CUDA). It needs two GPUs at least (the context-parallel degree is
the world size), so the one GPU this project is lent cannot show it either. On a CPU both modes are INFRA with
that reason; a runner with two GPUs runs them. The CUDA path has not run yet (no GPU was lent to the task that
wrote it): its CUDA outcomes have no expectation, and what a runner sees is the finding.

bug:   tiny Qwen2, LoRA r=8 on q/v, accelerate's FSDP2 plugin with ``ParallelismConfig(cp_size=world size)``, each
       step's forward and backward inside ``maybe_context_parallel`` (``repros/trainer/accelerate_cp.py``).
fixed: the same through the fixed trainer's guards (``accelerate-cp-context`` on accelerate 1.12.x: ``sp_backend``
       cleared before ``prepare``; free).
"""

from __future__ import annotations

from packaging.version import Version

from repros.catalog._stacks import ACC_1_12_CP
from repros.runtime.context import RankContext
from repros.runtime.outcomes import Outcome
from repros.runtime.record import ScenarioUnavailable
from repros.runtime.spec import Expectation, ReproSpec, Signature, WorldSizes
from repros.trainer.guards import GuardRule
from repros.trainer.scenario import Scenario

SCENARIO = Scenario(engine="fsdp2", bf16=True, gradient_checkpointing=False, context_parallel=True)

#: Why a CPU run is INFRA (the item's reason and the expectation's note).
CPU_REASON = (
    "F28 needs CUDA: accelerate refuses a ParallelismConfig on a CPU run (DistributedType.MULTI_CPU; accelerate 1.12.0 "
    "tried on gloo) and torch's context_parallel shards attention only through the CUDA SDPA kernels"
)

_CPU = (
    "CPU script (2026-11-27, accelerate 1.12.0, torch 2.13.0+cpu, torchrun 2 ranks, gloo): "
    "Accelerator(parallelism_config=ParallelismConfig(cp_size=2), fsdp_plugin=FSDP2) raises 'ParallelismConfig is "
    "only compatible DistributedType.FSDP (version 2) ... but got DistributedType.MULTI_CPU'; the boundary read "
    "from accelerate's history (PR #3817 in v1.12.0, PR #3858 first in v1.13.0)"
)

SPEC = ReproSpec(
    id="F28",
    title="accelerate FSDP2 context parallelism skipped by the sp_backend check: no _cp_context (CUDA, 2+ GPUs)",
    upstream=(
        "huggingface/accelerate#3856",
        "huggingface/accelerate#3867",
        "huggingface/accelerate PR #3858 (fix: the check removed; 1.13.0)",
        "huggingface/accelerate PR #3817 (1.12.0: the check, with the Ulysses integration)",
    ),
    signatures=(
        Signature(
            id="F28.no-cp-context",
            exception="AttributeError",
            pattern=r"^'Accelerator' object has no attribute '_cp_context'",
            description="maybe_context_parallel reads the context _prepare_cp skipped (raised before any collective: "
            "the same wording on NCCL and gloo)",
        ),
    ),
    expectations=(
        Expectation("bug", Outcome.INFRA, {}, established_by=_CPU, note=CPU_REASON, device="cpu", under=(ACC_1_12_CP,)),
        Expectation("fixed", Outcome.INFRA, {}, established_by=_CPU, note=CPU_REASON, device="cpu"),
    ),
    world_sizes=WorldSizes(minimum=2),
    world_sizes_why="context parallelism splits each sequence across the ranks: accelerate enables it only for "
    "cp_size > 1",
    depends_on=("torch", "peft", "transformers", "accelerate"),
    depends_on_why=(
        "accelerate's FSDP2 preparation skips torch's context_parallel for a transformers model with peft's "
        "adapters; no DeepSpeed runs (the sp_backend is only a name), nothing is quantized"
    ),
    description=__doc__ or "",
)


def run(ctx: RankContext) -> None:
    if ctx.device_type != "cuda":
        raise ScenarioUnavailable(CPU_REASON)
    from repros.trainer.accelerate_cp import train_context_parallel
    from repros.trainer.variants import scenario_for

    scenario, guards = scenario_for(ctx, SPEC, SCENARIO)
    train_context_parallel(scenario, ctx, guards)


# The fixed trainer's workaround of this failure: chosen by repros/trainer/guards.py (in its order), listed in
# docs/guards.md.
#: accelerate PR #3817 (1.12.0) made ``_prepare_cp`` return early for ``sp_backend == "deepspeed"`` (the default);
#: PR #3858 (1.13.0) removed that check. Read from accelerate's history; F28 needs CUDA.
ACCELERATE_CP_SKIPPED = (Version("1.12.0"), Version("1.13.0"))

GUARD = GuardRule(
    "accelerate-cp-context",
    "F28",
    lambda s, v: (
        s.context_parallel
        and not s.accelerate_cp_clear_sp_backend
        and (accelerate := v.get("accelerate")) is not None
        and ACCELERATE_CP_SKIPPED[0] <= accelerate < ACCELERATE_CP_SKIPPED[1]
    ),
    {"accelerate_cp_clear_sp_backend": True},
    lambda v: (
        f"accelerate {v.get('accelerate')} skips building the context-parallel context when sp_backend is "
        "'deepspeed', its default ('Accelerator' object has no attribute '_cp_context', F28, accelerate#3856, "
        "PR #3858): clear sp_backend before prepare (no sequence parallelism is configured)"
    ),
    explained=(
        "accelerate 1.12.x's ``_prepare_cp`` returns early when the parallelism config's ``sp_backend`` is "
        '``"deepspeed"``, its default even with no sequence parallelism, so FSDP2 context parallelism never '
        "builds ``_cp_context`` and ``maybe_context_parallel`` raises (F28, accelerate#3856/#3867, PR #3858): "
        "clear ``sp_backend`` before ``prepare``. Free."
    ),
)
