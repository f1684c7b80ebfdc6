"""F15 - FSDP ``cpu_ram_efficient_loading``: every rank but 0 loads NaN placeholders.

With accelerate's FSDP environment and ``fsdp_cpu_ram_efficient_loading: true``
(``ACCELERATE_USE_FSDP`` and ``FSDP_CPU_RAM_EFFICIENT_LOADING`` exported), transformers'
``from_pretrained`` reads the checkpoint on local rank 0 only; every other rank gets placeholders in
``_move_missing_keys_from_meta_to_device``, expected to be overwritten by rank 0's broadcast when the
model is sharded. The placeholders are ``torch.empty_like``: uninitialized memory, NaN and 1e38 among
it. From transformers PR #44473 (5.4.0) ``_initialize_missing_keys`` marks them initialized, so the
model's own initialization no longer overwrites them as it did on 5.0-5.3; PR #45050 (5.6.0) makes
them ``zeros_like``. Transformers 4.x (measured: 4.57.6) left them uninitialized too. Where nothing
broadcasts them (FSDP2's ``fully_shard`` has no ``sync_module_states``: TRL's ``prepare_fsdp`` shards a
reference model so, and so does a loop of one's own), the sharded model is rank 0's shard plus rank 1's
garbage, on every rank: the first loss is NaN (TRL saw its RLOO FSDP2 test fail, trl#5386).

bug:   tiny Qwen2 saved with ``save_pretrained`` (rank 0), loaded on both ranks with ``from_pretrained``
       under ``ACCELERATE_USE_FSDP=true`` and ``FSDP_CPU_RAM_EFFICIENT_LOADING=true``, LoRA r=8 on q/v,
       FSDP2 ``fully_shard`` on each decoder layer and the root, float32, no checkpointing, trained;
       a NaN or infinite loss is ``LossNotFinite``.
fixed: the same scenario through the fixed trainer's guards (``fsdp2-broadcast-rank0-weights``: rank 0's
       full state dict broadcast into the shards after ``fully_shard``, as accelerate's
       ``fsdp2_load_full_state_dict`` does).

Where the placeholders are finite (random initialization on 5.0-5.3, zeros on 5.6 and later) the bug
mode trains without NaN and is NOT_REPRODUCED, though without a broadcast the sharded base is still not
the checkpoint's: every rank records what it loaded (``placeholders``: tensors equal to the checkpoint,
NaN, infinite and zeroed elements), and the guard's broadcast covers both. transformers 5.23.0 loads
the weights on every rank (every tensor equal to the checkpoint).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from repros.catalog._stacks import CURRENT, TF4, TORCH_2_12_TF4, stack
from repros.runtime.context import RankContext
from repros.runtime.outcomes import Outcome
from repros.runtime.spec import Expectation, ReproSpec, Signature, Variant, WorldSizes
from repros.trainer.guards import GuardRule
from repros.trainer.scenario import Scenario

# Established by running (2026-11-26, torch 2.13.0+cpu, peft 0.21.2, accelerate 1.15.0, 2 ranks, gloo). See
# the module docstring for what each release leaves on rank 1.
_RUN = (
    "python -m harness run --cells tf-5.5,tf4,current --repros F15 (2026-11-26): bug REPRODUCED in tf-5.5 "
    "(transformers 5.5.4; rank 1: 0 of 27 tensors equal to the checkpoint, 59 NaN) and tf4 (4.57.6; 4 NaN), "
    "NOT_REPRODUCED in current (5.23.0: every rank loads the checkpoint); fixed PASS in all three; python -m "
    "harness run --cells torch-2.12-tf4,tf4-small --repros F15 (2026-11-26): bug REPRODUCED, fixed PASS in both"
)
_ESTABLISHED_5X = (
    f"{_RUN}; python -m harness bisect --repro F15 --mode bug --package transformers --good 5.3.0 --bad 5.5.4 "
    "--cell tf-5.5 -> first bad: transformers==5.4.0 (4 steps: 5.3.0 NOT_REPRODUCED; 5.4.0, 5.5.1, 5.5.4 "
    "REPRODUCED); python -m harness bisect --repro F15 --mode bug --package transformers --good 5.6.0 --bad 5.5.4 "
    "--cell tf-5.5 -> first good: transformers==5.6.0 (2 steps: 5.5.4 REPRODUCED, 5.6.0 NOT_REPRODUCED)"
)
_ESTABLISHED_4X = (
    f"{_RUN}; python -m harness bisect --repro F15 --mode bug --package transformers --good 5.0.0 --bad 4.57.6 "
    "--cell tf4 -> first good: transformers==5.0.0 (2 steps: 4.57.6 REPRODUCED, 5.0.0 NOT_REPRODUCED)"
)

#: The documented configuration (the ``bug`` mode; ``fixed`` runs it through the guards).
SCENARIO = Scenario(
    engine="fsdp2",
    bf16=False,
    gradient_checkpointing=False,
    fsdp_cpu_ram_efficient_loading=True,
)


def _not_finite(value: Any) -> bool:
    if isinstance(value, str):  # json_number: non-finite figures travel as their names
        return True
    return value is not None and not math.isfinite(float(value))


def raise_if_loss_not_finite(train_facts: Mapping[str, Any], loaded: list[Mapping[str, Any] | None]) -> None:
    """``LossNotFinite`` when any step's loss is NaN or infinite, naming what each rank loaded."""
    from repros.trainer.silent_failures import LossNotFinite

    losses = list(train_facts.get("losses") or [])
    bad = [i for i, value in enumerate(losses) if _not_finite(value)]
    if not bad:
        return
    ranks = "; ".join(
        f"rank {rank}: {facts.get('tensors_equal_to_checkpoint')} of "
        f"{(facts.get('tensors_equal_to_checkpoint') or 0) + (facts.get('tensors_differing') or 0)} tensors equal to "
        f"the checkpoint, {facts.get('nan_elements')} NaN, {facts.get('inf_elements')} infinite"
        for rank, facts in enumerate(loaded)
        if facts is not None
    )
    raise LossNotFinite(
        f"loss is not finite from step {bad[0] + 1} ({len(bad)} of {len(losses)} steps, first {losses[bad[0]]}) "
        f"after loading with cpu_ram_efficient_loading ({ranks})"
    )


def raise_if_placeholders_not_finite(loaded: list[Mapping[str, Any] | None]) -> None:
    """``LoadedNotFinite`` when a rank other than 0 loaded NaN or infinite placeholders."""
    from repros.trainer.silent_failures import LoadedNotFinite

    for rank, facts in enumerate(loaded):
        if rank == 0 or facts is None:
            continue
        nan, inf = facts.get("nan_elements") or 0, facts.get("inf_elements") or 0
        if nan or inf:
            raise LoadedNotFinite(
                f"rank {rank} loaded {nan} NaN and {inf} infinite elements with cpu_ram_efficient_loading "
                f"({facts.get('tensors_differing')} tensors not the checkpoint's, "
                f"first {facts.get('first_nonfinite')}); "
                "the loss stayed finite"
            )


SPEC = ReproSpec(
    id="F15",
    title="FSDP cpu_ram_efficient_loading: every rank but 0 loads NaN placeholders",
    upstream=(
        "huggingface/transformers PR #45050 (fix: zeros_like placeholders, 5.6.0)",
        "huggingface/transformers PR #44473 (5.4.0: placeholders marked initialized, no longer re-initialized)",
        "huggingface/trl#5386 (RLOO under FSDP2: NaN)",
        "huggingface/trl PR #5387, PR #5442 (test_rloo[fsdp2] marked xfail on transformers 5.4.0, then >= 5.4.0)",
        "huggingface/transformers#43749 (FSDP_CPU_RAM_EFFICIENT_LOADING broken: every rank allocates the model)",
    ),
    signatures=(
        Signature(
            id="F15.nan-placeholders",
            exception="repros.trainer.silent_failures.LoadedNotFinite",
            pattern=r"^rank \d+ loaded \d+ NaN",
            description="no error and a finite loss, but a rank other than 0 loaded NaN or infinite placeholders "
            "instead of the checkpoint (uninitialized memory whose garbage did not reach the loss this time)",
        ),
        Signature(
            id="F15.loss-nan",
            exception="repros.trainer.silent_failures.LossNotFinite",
            pattern=r"^loss is not finite from step \d+",
            description="no error, but the loss is NaN or infinite: a rank's FSDP2 shard of the base model is "
            "uninitialized memory",
        ),
    ),
    expectations=(
        Expectation(
            "bug",
            Outcome.REPRODUCED,
            {"transformers": ">=5.4.0,<5.6.0"},
            established_by=_ESTABLISHED_5X,
            under=(CURRENT,),
            observed={"transformers": ("5.4.0", "5.5.1", "5.5.4")},
            established_on="cpu",
        ),
        Expectation(
            "bug",
            Outcome.REPRODUCED,
            {"transformers": "<5.0.0.dev0"},
            established_by=_ESTABLISHED_4X,
            under=(TF4, TORCH_2_12_TF4),
            observed={"transformers": ("4.57.6",)},
            established_on="cpu",
        ),
        Expectation(
            "bug",
            Outcome.NOT_REPRODUCED,
            {},
            established_by=f"{_ESTABLISHED_5X}; {_ESTABLISHED_4X}",
            under=(CURRENT, stack(transformers="5.0.0"), stack(transformers="5.3.0"), stack(transformers="5.6.0")),
            established_on="cpu",
        ),
        Expectation("fixed", Outcome.PASS, {}, established_by=_RUN),
    ),
    world_sizes=WorldSizes(2),
    world_sizes_why=(
        "rank 0 reads the checkpoint and every other rank gets placeholders: with one rank there is no other "
        "rank (tf4 and tf-5.5 at world size 1: NOT_REPRODUCED)"
    ),
    depends_on=("torch", "peft", "transformers", "accelerate"),
    depends_on_why=(
        "transformers loads the checkpoint under accelerate's FSDP environment and torch's fully_shard shards it, "
        "peft adding the adapter; no DeepSpeed runs, nothing is quantized"
    ),
    description=__doc__ or "",
    variants=(
        Variant(
            "no-ram-efficient-loading",
            "fsdp_cpu_ram_efficient_loading off: every rank reads the whole checkpoint (its CPU memory on every rank)",
            {"fsdp_cpu_ram_efficient_loading": False},
            claim="huggingface/transformers#43749 (what users fall back to)",
        ),
    ),
)


def run(ctx: RankContext) -> None:
    from repros.trainer.fixed_trainer import train
    from repros.trainer.variants import scenario_for

    scenario, guards = scenario_for(ctx, SPEC, SCENARIO)
    train(scenario, ctx, guards)
    loaded = _every_rank(ctx.facts.get("placeholders"))
    raise_if_loss_not_finite(ctx.facts.get("train") or {}, loaded)
    if ctx.mode == "bug":
        # The documented failure itself: the garbage is uninitialized memory, so whether it reaches the
        # loss depends on what that memory held; a NaN loaded on a rank but 0 is the failure either way.
        # (The fixed mode's guard broadcasts rank 0's weights after this load: what it loaded is not trained.)
        raise_if_placeholders_not_finite(loaded)


def _every_rank(facts: Mapping[str, Any] | None) -> list[Mapping[str, Any] | None]:
    """What every rank loaded (each rank's ``placeholders`` fact), in rank order."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [facts]
    gathered: list[Mapping[str, Any] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, facts)
    return gathered


# The fixed trainer's workaround of this failure: chosen by repros/trainer/guards.py (in its order), listed in
# docs/guards.md.
GUARD = GuardRule(
    "fsdp2-broadcast-rank0-weights",
    "F15",
    lambda s, v: s.engine == "fsdp2" and s.fsdp_cpu_ram_efficient_loading and not s.fsdp2_broadcast_from_rank0,
    {"fsdp2_broadcast_from_rank0": True},
    lambda v: (
        f"transformers {v.get('transformers')} loads a cpu_ram_efficient_loading checkpoint on rank 0 only; the "
        "other ranks hold placeholders (uninitialized memory, NaN, on 4.x and 5.4-5.5: F15) until rank 0 "
        "broadcasts: broadcast after sharding, as accelerate's fsdp2_load_full_state_dict does"
    ),
    explained=(
        "under FSDP's ``cpu_ram_efficient_loading`` transformers loads the checkpoint on rank 0 only and leaves "
        "the other ranks placeholders (uninitialized memory on 4.x and 5.4-5.5, NaN among it: F15); after "
        "``fully_shard``, broadcast rank 0's full state dict into every rank's shards (accelerate's "
        "``fsdp2_load_full_state_dict``)."
    ),
)
