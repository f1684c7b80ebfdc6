"""F16 - FSDP2 ``FULL_STATE_DICT`` adapter-only checkpoint: only rank 0's shard is written, silently.

transformers' ``Trainer`` checkpoints a PEFT model under FSDP with accelerate's
``save_fsdp_model(..., adapter_only=True)`` (``get_fsdp_ckpt_kwargs()`` passes it whenever
``save_fsdp_model`` takes it). With FSDP2 and ``fsdp_state_dict_type: FULL_STATE_DICT``, accelerate
1.7.0 (PR #3527, FSDP2's ``FULL_STATE_DICT``) to 1.14.0 takes the adapter from PEFT's
``get_peft_model_state_dict``: FSDP2's parameters are DTensors, nothing gathers them, and rank 0's
``torch.save`` writes ``pytorch_model_fsdp.bin`` holding rank 0's local shard of every adapter tensor
(a DTensor of the full global shape around it). Nothing raises; resuming from the checkpoint restores
rank 0's slice only, so on N ranks (N-1)/N of every adapter tensor goes back to its initialization.
accelerate PR #4206 (1.15.0) gathers the adapter with torch's ``get_model_state_dict``
(``full_state_dict``, ``ignore_frozen_params``). Before 1.7.0 accelerate's FSDP2 plugin refused
``FULL_STATE_DICT`` ("FSDP2 only supports SHARDED_STATE_DICT for now"; not run here).

bug:   tiny Qwen2 reloaded from a checkpoint, LoRA r=8 on q/v, FSDP2 ``fully_shard`` on each decoder
       layer and the root, float32, no checkpointing, own loop, trained; then accelerate's
       ``save_fsdp_model`` with ``FullyShardedDataParallelPlugin(fsdp_version=2,
       state_dict_type="FULL_STATE_DICT")`` and ``adapter_only=True`` (the Trainer's call); rank 0
       compares every tensor in the file with the trained adapter's full tensor
       (``SavedAdapterIncomplete`` when one differs).
fixed: the same scenario through the fixed trainer's guards (``fsdp2-adapter-full-state-dict``: the
       adapter's full tensors gathered with ``get_model_state_dict`` and written by rank 0).
"""

from __future__ import annotations

from packaging.version import Version

from repros.catalog._stacks import CURRENT
from repros.runtime.context import RankContext
from repros.runtime.outcomes import Outcome
from repros.runtime.spec import Expectation, ReproSpec, Signature, WorldSizes
from repros.trainer.guards import GuardRule
from repros.trainer.scenario import Scenario

# Established by running (2026-11-26, torch 2.13.0+cpu, transformers 5.23.0, peft 0.21.2, 2 ranks, gloo).
_RUN = (
    "python -m harness run --cells acc-1.14,current --repros F16 (2026-11-26): bug REPRODUCED in acc-1.14 "
    "(accelerate 1.14.0: 0 of 8 adapter tensors in pytorch_model_fsdp.bin complete, each a DTensor holding rank "
    "0's local shard, e.g. (4, 64) of (8, 64); 13358 bytes against 18407 gathered), NOT_REPRODUCED in current "
    "(1.15.0); fixed PASS in both"
)
_ESTABLISHED = (
    f"{_RUN}; python -m harness bisect --repro F16 --mode bug --package accelerate --good 1.15.0 --bad 1.7.0 "
    "--cell acc-1.14 -> first good: accelerate==1.15.0 (6 steps: 1.7.0, 1.10.1, 1.12.0, 1.13.0, 1.14.0 "
    "REPRODUCED; 1.15.0 NOT_REPRODUCED)"
)

#: The documented configuration (the ``bug`` mode; ``fixed`` runs it through the guards).
SCENARIO = Scenario(
    engine="fsdp2",
    bf16=False,
    gradient_checkpointing=False,
    fsdp2_trainer_adapter_checkpoint=True,
)

SPEC = ReproSpec(
    id="F16",
    title="FSDP2 FULL_STATE_DICT adapter-only checkpoint: only rank 0's shard is written",
    upstream=(
        "huggingface/accelerate PR #4206 (fix: the adapter gathered by get_model_state_dict; 1.15.0)",
        "huggingface/accelerate PR #3527 (FSDP2's FULL_STATE_DICT, 1.7.0)",
    ),
    signatures=(
        Signature(
            id="F16.saved-adapter-rank0-shard",
            exception="repros.trainer.silent_failures.SavedAdapterIncomplete",
            pattern=r"^saved adapter incomplete: \d+ of \d+ tensors in pytorch_model_fsdp\.bin",
            description="no error, but the adapter checkpoint holds rank 0's shard of each tensor, not the full tensor",
        ),
    ),
    expectations=(
        Expectation(
            "bug",
            Outcome.REPRODUCED,
            {"accelerate": ">=1.7.0,<1.15.0"},
            established_by=_ESTABLISHED,
            under=(CURRENT,),
            observed={"accelerate": ("1.7.0", "1.10.1", "1.12.0", "1.13.0", "1.14.0")},
            established_on="cpu",
        ),
        Expectation(
            "bug", Outcome.NOT_REPRODUCED, {}, established_by=_ESTABLISHED, under=(CURRENT,), established_on="cpu"
        ),
        Expectation("fixed", Outcome.PASS, {}, established_by=_RUN),
    ),
    world_sizes=WorldSizes(2),
    world_sizes_why=(
        "only rank 0's shard of the adapter is saved: with one rank its shard is the whole adapter (acc-1.14 "
        "at world size 1: NOT_REPRODUCED)"
    ),
    depends_on=("torch", "peft", "transformers", "accelerate"),
    depends_on_why=(
        "accelerate saves peft's state dict of a transformers model that torch's FSDP2 sharded; no DeepSpeed runs, "
        "nothing is quantized"
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
#: First accelerate release whose FSDP2 ``FULL_STATE_DICT`` adapter-only save gathers the adapter's full
#: tensors (PR #4206). Established by running F16 (see repros/catalog/f16_fsdp2_adapter_only_rank0_shard.py).
ACCELERATE_FSDP2_ADAPTER_FULL_SAVE = Version("1.15.0")

GUARD = GuardRule(
    "fsdp2-adapter-full-state-dict",
    "F16",
    lambda s, v: (
        s.engine == "fsdp2"
        and s.fsdp2_trainer_adapter_checkpoint
        and not s.fsdp2_adapter_full_state_dict
        and (accelerate := v.get("accelerate")) is not None
        and accelerate < ACCELERATE_FSDP2_ADAPTER_FULL_SAVE
    ),
    {"fsdp2_adapter_full_state_dict": True},
    lambda v: (
        f"accelerate {v.get('accelerate')} < {ACCELERATE_FSDP2_ADAPTER_FULL_SAVE} saves an FSDP2 adapter "
        "(FULL_STATE_DICT, adapter_only) from PEFT's DTensors: rank 0's shard only (F16, accelerate PR #4206)"
    ),
    explained=(
        "accelerate before 1.15.0 checkpoints an FSDP2 adapter as transformers' ``Trainer`` asks "
        "(``FULL_STATE_DICT``, ``adapter_only=True``) from PEFT's state dict of DTensors, so rank 0 writes only "
        "its own shard of each tensor (F16, accelerate PR #4206); gather the full tensors with torch's "
        "``get_model_state_dict`` and write them on rank 0."
    ),
)
