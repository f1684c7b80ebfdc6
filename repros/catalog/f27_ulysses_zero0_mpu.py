"""F27 - Ulysses with ZeRO stage 0 (bf16): ``parallel_state_sp has no attribute get_model_parallel_rank``.

With ZeRO stage 0 and bf16, DeepSpeed wraps the optimizer itself, and at every step the wrapper asks the
engine's mpu for the deprecated Megatron model-parallel API: DeepSpeed's own optimizer goes through
``BF16_Optimizer``, whose gradient norm calls ``bwc_tensor_model_parallel_rank(mpu)`` (it tries
``get_tensor_model_parallel_rank``, then ``get_slice_parallel_rank``, then calls ``get_model_parallel_rank``
unconditionally: DeepSpeed#7833's traceback); a client torch optimizer goes through the unfused optimizer,
whose overflow check calls ``mpu.get_model_parallel_group()``. Under Ulysses the mpu is DeepSpeed's own
``deepspeed.runtime.sequence_parallel.parallel_state_sp`` module, which before PR #7649 (0.18.2, "ulysses mpu:
additional api", made for checkpoint saving) has none of them: the first ``engine.step()`` raises
``AttributeError: module 'deepspeed.runtime.sequence_parallel.parallel_state_sp' has no attribute
'get_model_parallel_rank'`` (``..._group`` with a torch optimizer, as here). ZeRO stages 1-3 never ask and train
(DeepSpeed#7833). PR #7649 aliases ``get_model_parallel_rank``, ``_group`` and ``_world_size`` to the
sequence-parallel ones, so from 0.18.2 the step runs (measured); PR #7888 (open) would make ``bwc`` fall back to
rank 0 instead.

The sequence-parallel degree is the item's world size, two ranks at least.

bug:   tiny Qwen2, LoRA r=8 on q/v, bf16, ZeRO stage 0, a torch AdamW as the client optimizer (no JIT-built
       DeepSpeed Adam), Ulysses over every rank as the ALST tutorial writes it (``repros/trainer/ulysses.py``),
       the transformers model registered (so F26 cannot come first).
fixed: the same through the fixed trainer's guards (``ulysses-zero1-not-zero0`` on deepspeed < 0.18.2: ZeRO
       stage 1, whose optimizer never asks; optimizer states partitioned across the ranks).
"""

from __future__ import annotations

from packaging.version import Version

from repros.catalog._stacks import CURRENT, SP_DS_0_18_1, SP_DS_0_18_3, stack
from repros.runtime.context import RankContext
from repros.runtime.outcomes import Outcome
from repros.runtime.spec import Expectation, ReproSpec, Signature, Variant, WorldSizes
from repros.trainer.guards import GuardRule, Versions
from repros.trainer.scenario import Scenario

SCENARIO = Scenario(
    engine="deepspeed",
    zero_stage=0,
    bf16=True,
    gradient_checkpointing=False,
    sequence_parallel=True,
    ulysses_register_base_model=True,
    learning_rate=1e-2,
)

_ESTABLISHED = (
    "python -m harness run --cells sp-ds-0.18.1,sp-ds-0.18.3,current-new-paths --repros F26,F27 (2026-11-27); "
    "python -m harness bisect --repro F27 --mode bug --package deepspeed --good 0.18.2 --bad 0.18.1 "
    "--cell sp-ds-0.18.1 -> first good: deepspeed==0.18.2 (2 steps, 378 s)"
)

SPEC = ReproSpec(
    id="F27",
    title="Ulysses sequence parallelism with ZeRO stage 0 (bf16): the mpu has no get_model_parallel_rank / _group",
    upstream=(
        "deepspeedai/DeepSpeed#7833",
        "deepspeedai/DeepSpeed PR #7649 (the mpu's get_model_parallel_rank alias; 0.18.2)",
        "deepspeedai/DeepSpeed PR #7888 (bwc falls back to rank 0; open)",
    ),
    signatures=(
        Signature(
            id="F27.mpu-model-parallel-rank",
            exception="AttributeError",
            pattern=r"module 'deepspeed\.runtime\.sequence_parallel\.parallel_state_sp' has no attribute "
            r"'get_model_parallel_(rank|group|world_size)'",
            description="ZeRO stage 0's bf16 optimizer wrapper asks the Ulysses mpu for the deprecated model-parallel "
            "rank (BF16_Optimizer) or group (a torch optimizer's overflow check), in the step before its collectives: "
            "the same wording on NCCL and gloo",
        ),
    ),
    expectations=(
        Expectation(
            "bug",
            Outcome.REPRODUCED,
            {"deepspeed": ">=0.17.0,<0.18.2"},
            established_by=_ESTABLISHED,
            under=(SP_DS_0_18_1,),
            observed={"deepspeed": ("0.18.1",)},
            established_on="cpu",
        ),
        # sp-ds-0.18.3, current-new-paths, and the bisect's good step (sp-ds-0.18.1 with deepspeed 0.18.2).
        Expectation(
            "bug",
            Outcome.NOT_REPRODUCED,
            {},
            established_by=_ESTABLISHED,
            under=(SP_DS_0_18_3, CURRENT, stack(deepspeed="0.18.2")),
            established_on="cpu",
        ),
        Expectation("fixed", Outcome.PASS, {}, established_by=_ESTABLISHED),
    ),
    variants=(
        Variant(
            "zero1",
            "ZeRO stage 1 instead of 0 (what the fixed trainer does where this fails; priced where it does not)",
            {"zero_stage": 1},
            claim="deepspeedai/DeepSpeed#7833 (stages 1/2/3 train)",
        ),
    ),
    world_sizes=WorldSizes(minimum=2),
    world_sizes_why="Ulysses splits the sequence across the ranks of its group: at degree 1 register_with_transformers "
    "returns no mpu and the optimizer never asks it",
    depends_on=("torch", "deepspeed", "peft", "transformers"),
    depends_on_why=(
        "ZeRO stage 0's bf16 optimizer wrapper (deepspeed) asks DeepSpeed's Ulysses mpu, registered with transformers' "
        "attention, for the model-parallel group while it steps peft's adapters with a torch optimizer; the repro "
        "drives DeepSpeed's engine itself, so accelerate takes no part, and nothing is quantized"
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
#: DeepSpeed PR #7649 (0.18.2): Ulysses' ``parallel_state_sp`` has ``get_model_parallel_rank``, which ZeRO stage 0's
#: bf16 optimizer asks of its mpu. Bisected by F27 (repros/catalog/f27_ulysses_zero0_mpu.py).
DEEPSPEED_ULYSSES_MPU_MODEL_PARALLEL_RANK = Version("0.18.2")


def _ulysses_zero0_bf16_asks_model_parallel_rank(s: Scenario, v: Versions) -> bool:
    deepspeed = v.get("deepspeed")
    return (
        s.sequence_parallel
        and s.zero_stage == 0
        and s.bf16
        and deepspeed is not None
        and deepspeed < DEEPSPEED_ULYSSES_MPU_MODEL_PARALLEL_RANK
    )


GUARD = GuardRule(
    "ulysses-zero1-not-zero0",
    "F27",
    _ulysses_zero0_bf16_asks_model_parallel_rank,
    {"zero_stage": 1},
    lambda v: (
        f"deepspeed {v.get('deepspeed')} < {DEEPSPEED_ULYSSES_MPU_MODEL_PARALLEL_RANK}: ZeRO stage 0's bf16 "
        "optimizer asks the Ulysses mpu for get_model_parallel_rank/_group, which it lacks (F27, DeepSpeed#7833, "
        "PR "
        "#7649): ZeRO stage 1 (its optimizer never asks; optimizer states partitioned across the ranks)"
    ),
    explained=(
        "DeepSpeed 0.17.0 .. 0.18.1 with Ulysses and ZeRO stage 0 in bf16: the optimizer wrapper asks its mpu "
        "(Ulysses' ``parallel_state_sp``) for the deprecated ``get_model_parallel_rank`` (or ``_group``), which "
        "it does not have before PR #7649 (F27, DeepSpeed#7833): ZeRO stage 1, whose optimizer never asks "
        "(optimizer states partitioned: less memory per rank, a gather after each step)."
    ),
)
