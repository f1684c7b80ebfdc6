"""F14 - FSDP2 + QLoRA: 4-bit weights in bitsandbytes' default uint8 storage cannot be sharded (torch < 2.12).

QLoRA under FSDP2 goes through accelerate's ``fsdp2_prepare_model`` (``Accelerator.prepare`` with an
FSDP2 plugin: transformers' ``Trainer``, ``accelerate launch``). From 1.6.0 (FSDP2 in accelerate) to
1.13.x it hands every parameter of each wrapped module to torch's ``fully_shard``, the frozen 4-bit
``Params4bit`` weights included, which bitsandbytes stores as ``uint8`` unless
``bnb_4bit_quant_storage`` says otherwise. torch before 2.12.0 builds each sharded parameter as
``nn.Parameter(dtensor)``, which makes it require grad before the original's ``requires_grad`` is
restored, and a ``uint8`` tensor cannot: ``RuntimeError: only Tensors of floating point dtype can
require gradients`` from ``FSDPParam._init_sharded_param``, on every rank, before the first step (the
same on NCCL and gloo: pytorch#177844). torch PR #177948 (2.12.0) builds it with the original's flag;
accelerate PR #3987 (1.14.0) leaves non-float frozen ``Params4bit`` out of the sharding (a warning:
"Found N non-floating frozen Params4bit. Excluding from FSDP2 sharding"). The QLoRA-with-FSDP recipes'
workaround: ``bnb_4bit_quant_storage`` = the compute dtype (bf16), which FSDP shards like any weight.

accelerate selects FSDP only for GPU runs; on a CPU the repro sets the FSDP2 plugin on the accelerator's
state and calls ``fsdp2_prepare_model`` as ``prepare`` would (``repros/trainer/fsdp2_accelerate.py``).

bug:   tiny Qwen2 loaded 4-bit (nf4, bf16 compute, bitsandbytes' default uint8 storage) with
       ``from_pretrained``, LoRA r=8 on q/v by ``get_peft_model`` (after
       ``prepare_model_for_kbit_training``), sharded by accelerate's ``fsdp2_prepare_model`` (each
       decoder layer and the root, bf16 mixed precision), no checkpointing, the fixed trainer's loop.
fixed: the same scenario through the fixed trainer's guards (``bnb-4bit-storage-compute-dtype`` on
       torch < 2.12 where accelerate does not leave the 4-bit weights out: ``bnb_4bit_quant_storage=bfloat16``).

Not the float16/float32 storage mismatches of the same thread: storage float16 under a bf16 policy
trains silently different losses, and float32 storage breaks bitsandbytes' CPU repacking ("shape ... is
invalid for input of size"); neither is version-bounded, and neither is this signature.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packaging.version import Version

from repros.catalog._stacks import CURRENT, TORCH_2_11_ACC_1_13, TORCH_2_12_TF4, stack
from repros.runtime.context import RankContext
from repros.runtime.outcomes import Outcome
from repros.runtime.spec import Expectation, ReproSpec, Signature, Variant
from repros.trainer.guards import GuardRule, Versions
from repros.trainer.scenario import Scenario

SCENARIO = Scenario(
    engine="fsdp2",
    bf16=True,
    quantization="nf4",
    gradient_checkpointing=False,
    fsdp2_accelerate_prepare=True,
)

# Established by running (2026-11-26, 2 ranks, gloo, CPU; torch 2.11.0 is a CUDA build run on CPU).
_RUN = (
    "python -m harness run --lane nightly --repros F14 (2026-11-26): bug REPRODUCED in torch-2.11-acc-1.13 "
    "(torch 2.11.0, accelerate 1.13.0: RuntimeError on both ranks in fully_shard), NOT_REPRODUCED in "
    "torch-2.11-acc-1.14 (accelerate PR #3987), torch-2.12-tf4 (torch 2.12.1) and current (torch 2.13.0); "
    "fixed PASS in all four"
)
_ESTABLISHED = (
    f"{_RUN}; python -m harness bisect --repro F14 --mode bug --package accelerate --good 1.14.0 --bad 1.7.0 "
    "--cell torch-2.11-acc-1.13 -> first good: accelerate==1.14.0 (6 steps, 581 s: 1.7.0, 1.10.0, 1.11.0, 1.12.0, "
    "1.13.0 REPRODUCED; 1.14.0 NOT_REPRODUCED); accelerate 1.6.0 reproduces too (a script: fsdp2_prepare_model, "
    "FSDP2 in accelerate from 1.6.0); GPU (H200, torch 2.11.0+cu130, 1 rank, NCCL, accelerator.prepare with "
    "distributed_type FSDP): accelerate 1.13.0 the same RuntimeError, 1.15.0 trains with the warning"
)


def fsdp2_with_4bit(facts: Mapping[str, Any]) -> bool:
    """An FSDP2 run of a 4-bit model (the error alone is any int tensor asked to require grad)."""
    return facts.get("engine") == "fsdp2" and facts.get("quantization") == "nf4"


SPEC = ReproSpec(
    id="F14",
    title="FSDP2 + QLoRA: 4-bit weights in uint8 storage cannot be sharded (torch < 2.12, accelerate < 1.14)",
    upstream=(
        "huggingface/accelerate#3983",
        "huggingface/accelerate PR #3987 (fix: non-float frozen Params4bit left out of fully_shard; 1.14.0)",
        "pytorch/pytorch#177844 / PR #177948 (fix: the sharded parameter keeps the original's requires_grad; 2.12.0)",
    ),
    signatures=(
        Signature(
            id="F14.uint8-requires-grad",
            exception="RuntimeError",
            pattern=r"^only Tensors of floating point dtype can require gradients",
            facts_checks=(fsdp2_with_4bit,),
            description="FSDP2 asked a frozen uint8 4-bit weight to require grad while sharding it (NCCL, gloo alike)",
        ),
    ),
    expectations=(
        Expectation(
            "bug",
            Outcome.REPRODUCED,
            {"torch": "<2.12.0", "accelerate": ">=1.6.0,<1.14.0"},
            established_by=_ESTABLISHED,
            under=(TORCH_2_11_ACC_1_13,),
            observed={"torch": ("2.11.0",), "accelerate": ("1.7.0", "1.10.0", "1.11.0", "1.12.0", "1.13.0")},
            established_on="cpu",
        ),
        Expectation(
            "bug",
            Outcome.NOT_REPRODUCED,
            {},
            established_by=_ESTABLISHED,
            under=(stack(torch="2.11.0", accelerate="1.14.0"), TORCH_2_12_TF4, CURRENT),
            established_on="cpu",
        ),
        Expectation("fixed", Outcome.PASS, {}, established_by=_RUN),
    ),
    variants=(
        Variant(
            "storage-bf16",
            "the 4-bit weights stored in the compute dtype (bnb_4bit_quant_storage=torch.bfloat16): the fixed "
            "trainer's guard alone, priced where torch or accelerate already cope with uint8",
            {"bnb_4bit_quant_storage": "bfloat16"},
            claim="huggingface/accelerate#3983; the QLoRA-with-FSDP recipes (PEFT's docs, axolotl)",
        ),
    ),
    depends_on=("torch", "peft", "transformers", "accelerate", "bitsandbytes"),
    depends_on_why=(
        "accelerate's FSDP2 preparation has torch's fully_shard shard bitsandbytes' 4-bit weights of a transformers "
        "model under peft's adapters; no DeepSpeed runs"
    ),
    description=__doc__ or "",
)


def run(ctx: RankContext) -> None:
    from repros.trainer.fixed_trainer import train
    from repros.trainer.variants import scenario_for

    scenario, guards = scenario_for(ctx, SPEC, SCENARIO)
    train(scenario, ctx, guards)


# The fixed trainer's workaround of this failure: chosen by repros/trainer/guards.py (in its order), listed in
# docs/guards.md.
#: torch PR #177948 (2.12.0): FSDP2 builds a sharded parameter with the original's ``requires_grad``
#: instead of making it require grad first, so a frozen non-float (uint8 4-bit) parameter can be sharded.
TORCH_FSDP2_NONFLOAT_PARAMS = Version("2.12.0")

#: accelerate PR #3987 (1.14.0): ``fsdp2_prepare_model`` leaves non-float frozen ``Params4bit`` out of
#: ``fully_shard`` (its ``ignored_params``).
ACCELERATE_FSDP2_IGNORES_PARAMS4BIT = Version("1.14.0")


def _fsdp2_shards_uint8_params4bit(s: Scenario, v: Versions) -> bool:
    """FSDP2 on torch before PR #177948 would be handed bitsandbytes' uint8 4-bit weights (F14)."""
    torch = v.get("torch")
    accelerate = v.get("accelerate")
    accelerate_ignores_them = (
        s.fsdp2_accelerate_prepare and accelerate is not None and accelerate >= ACCELERATE_FSDP2_IGNORES_PARAMS4BIT
    )
    return (
        s.engine == "fsdp2"
        and s.quantization == "nf4"
        and s.bnb_4bit_quant_storage in (None, "uint8")
        and torch is not None
        and torch < TORCH_FSDP2_NONFLOAT_PARAMS
        and not accelerate_ignores_them
    )


GUARD = GuardRule(
    "bnb-4bit-storage-compute-dtype",
    "F14",
    _fsdp2_shards_uint8_params4bit,
    {"bnb_4bit_quant_storage": "bfloat16"},
    lambda v: (
        f"torch {v.get('torch')} < {TORCH_FSDP2_NONFLOAT_PARAMS} cannot shard bitsandbytes' uint8 4-bit weights "
        "with FSDP2 ('only Tensors of floating point dtype can require gradients', F14, torch PR #177948, "
        "accelerate PR #3987): store them in the compute dtype (bnb_4bit_quant_storage=bfloat16)"
    ),
    explained=(
        "FSDP2 on torch before 2.12 makes every parameter it shards require grad before freezing it again, which "
        "bitsandbytes' 4-bit weights in their default ``uint8`` storage refuse (\"only Tensors of floating point "
        'dtype can require gradients"; F14, torch PR #177948; accelerate from 1.14.0, PR #3987, leaves them out '
        "of the sharding); store the 4-bit weights in the compute dtype "
        "(``bnb_4bit_quant_storage=torch.bfloat16``), as the QLoRA-with-FSDP recipes do."
    ),
)
