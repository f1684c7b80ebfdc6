"""F24 - FSDP2 over 4-bit weights stored in bfloat16: NaN bit patterns rewritten, the forward silently wrong (CUDA).

bitsandbytes packs two 4-bit (NF4) indices a byte and stores the packed bytes in the dtype
``bnb_4bit_quant_storage`` names; the QLoRA-with-FSDP recipes store them in bfloat16, so FSDP can shard them
like any float parameter. About 0.1 % of the packed elements then happen to be bf16 NaN bit patterns
(exponent all ones, mantissa not zero). After ``fully_shard``, FSDP2's parameter swap copies the parameter
through a float path on CUDA that canonicalizes every NaN to one quiet NaN (``0x7FFF``): the bytes change,
``matmul_4bit`` decodes other 4-bit indices, and the forward output is wrong without any error, at world
size 1 already (bitsandbytes#1945, open: "a PyTorch FSDP2 / DTensor issue"; a second path,
``full_tensor()`` / ``redistribute`` on such a parameter, segfaults). Storing the packed bytes as ``uint8``
(bitsandbytes' default) avoids every float path; FSDP2 can shard uint8 from torch 2.12 (F14's fix).

It cannot occur on a CPU: there the parameter swap copies bit for bit (tried 2026-11-27, torch 2.13.0+cpu,
bitsandbytes 0.50.2, world size 1: 12 of 18432 packed elements were bf16 NaN patterns, and the logits after
``fully_shard`` equalled those before, max difference 0.0). On a CPU both modes are INFRA with that reason; a
GPU runner runs them for real. The CUDA path has not run yet (the task that wrote it was lent no GPU): its
CUDA outcomes have no expectation, and what a runner sees is the finding.

bug:   the tiny Qwen2 loaded 4-bit (NF4) with ``bnb_4bit_quant_storage=bfloat16``, logits on the fixed batch,
       ``fully_shard`` on each decoder layer and the root (the fixed trainer's FSDP2 wrapping), logits again:
       any difference is ``ShardedForwardDiffers``; then the fixed trainer's QLoRA on FSDP2 trains it.
fixed: the same through the fixed trainer's guards (``bnb-4bit-uint8-storage-fsdp2`` on torch >= 2.12: the
       packed weights kept in uint8).
"""

from __future__ import annotations

from repros.catalog._stacks import CURRENT
from repros.catalog.f14_fsdp2_qlora_uint8_storage import TORCH_FSDP2_NONFLOAT_PARAMS
from repros.runtime.context import RankContext
from repros.runtime.outcomes import Outcome
from repros.runtime.record import ScenarioUnavailable
from repros.runtime.spec import Expectation, ReproSpec, Signature
from repros.trainer.guards import GuardRule, Versions
from repros.trainer.scenario import Scenario

SCENARIO = Scenario(
    engine="fsdp2",
    bf16=True,
    quantization="nf4",
    bnb_4bit_quant_storage="bfloat16",
    gradient_checkpointing=False,
)

#: Why a CPU run is INFRA (the item's reason and the expectation's note).
CPU_REASON = (
    "F24 needs CUDA: FSDP2's parameter swap rewrites bf16 NaN bit patterns only on CUDA; on a CPU it copies bit for "
    "bit (torch 2.13.0+cpu, bitsandbytes 0.50.2, world size 1: 12 of 18432 packed elements were NaN patterns, logits "
    "unchanged by fully_shard)"
)

_CPU = (
    "CPU script (2026-11-27, torch 2.13.0+cpu, bitsandbytes 0.50.2, world size 1, gloo): the tiny Qwen2 in NF4 with "
    "bf16 storage, logits before and after fully_shard: max difference 0.0; python -m harness run --cells "
    "current-cuda-only --repros F24: bug INFRA, fixed INFRA"
)

SPEC = ReproSpec(
    id="F24",
    title="FSDP2 over 4-bit weights stored in bfloat16: NaN bit patterns rewritten, the forward silently wrong (CUDA)",
    upstream=(
        "bitsandbytes-foundation/bitsandbytes#1945 (open)",
        "bitsandbytes-foundation/bitsandbytes PR #970 (bnb_4bit_quant_storage for FSDP)",
    ),
    signatures=(
        Signature(
            id="F24.sharded-forward-differs",
            exception="repros.trainer.silent_failures.ShardedForwardDiffers",
            pattern=r"^forward differs after fully_shard",
            description="no error: the logits after fully_shard differ from those before (the packed 4-bit bytes "
            "were rewritten; at world size 1 no collective is involved, the same on NCCL and gloo)",
        ),
    ),
    expectations=(
        Expectation("bug", Outcome.INFRA, {}, established_by=_CPU, note=CPU_REASON, device="cpu", under=(CURRENT,)),
        Expectation("fixed", Outcome.INFRA, {}, established_by=_CPU, note=CPU_REASON, device="cpu"),
    ),
    world_size=1,
    depends_on=("torch", "transformers", "accelerate", "bitsandbytes"),
    depends_on_why=(
        "torch's FSDP2 parameter swap (its CUDA copy path) rewrites the bytes bitsandbytes packed its 4-bit weights "
        "into, stored in bfloat16 by transformers' quantized load (which requires accelerate); the forwards compared "
        "have no adapter, so peft takes no part, and no DeepSpeed runs"
    ),
    description=__doc__ or "",
)


def run(ctx: RankContext) -> None:
    if ctx.device_type != "cuda":
        raise ScenarioUnavailable(CPU_REASON)
    from repros.trainer.fixed_trainer import train
    from repros.trainer.fsdp2_4bit_check import check_sharded_forward
    from repros.trainer.guards import apply_guards
    from repros.trainer.variants import scenario_for

    scenario, guards = scenario_for(ctx, SPEC, SCENARIO)
    check_sharded_forward(apply_guards(scenario, guards), ctx)
    train(scenario, ctx, guards)


# The fixed trainer's workaround of this failure: chosen by repros/trainer/guards.py (in its order), listed in
# docs/guards.md.
def _fsdp2_4bit_float_storage(s: Scenario, v: Versions) -> bool:
    """FSDP2 on a torch that can shard uint8 (>= 2.12) handed 4-bit weights packed in bfloat16 (F24)."""
    torch = v.get("torch")
    return (
        s.engine == "fsdp2"
        and s.quantization == "nf4"
        and s.bnb_4bit_quant_storage not in (None, "uint8")
        and torch is not None
        and torch >= TORCH_FSDP2_NONFLOAT_PARAMS
    )


GUARD = GuardRule(
    "bnb-4bit-uint8-storage-fsdp2",
    "F24",
    _fsdp2_4bit_float_storage,
    {"bnb_4bit_quant_storage": "uint8"},
    lambda v: (
        f"FSDP2 on CUDA rewrites every bf16 NaN bit pattern its parameter swap copies, and 4-bit weights packed "
        f"in bfloat16 hold some: the forward silently changes (F24, bitsandbytes#1945, open); torch "
        f"{v.get('torch')} >= {TORCH_FSDP2_NONFLOAT_PARAMS} shards uint8 storage, which no float path touches"
    ),
    explained=(
        "bitsandbytes packs two 4-bit indices a byte; stored in bfloat16 (the QLoRA-with-FSDP recipes' "
        "``bnb_4bit_quant_storage``), about 0.1 % of the packed elements are bf16 NaN bit patterns, which FSDP2's "
        "parameter swap on CUDA rewrites to one canonical NaN, so the 4-bit weights decode to other values and "
        "the forward is silently wrong (F24, bitsandbytes#1945, open; a CPU copies them bit for bit): on torch >= "
        "2.12, which shards uint8 (F14's fix), keep bitsandbytes' ``uint8`` storage. (On torch < 2.12 F14's guard "
        "must store them in bfloat16: on CUDA that meets this failure; no guard covers both there.)"
    ),
)
