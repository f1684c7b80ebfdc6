"""F17 - ZeRO-3 on gloo reads a gathered parameter before its all-gather arrived.

``Init._allgather_params_coalesced`` (what ``GatheredParameters`` and the optimizer's re-gather of
persistent parameters call for more than one parameter) launches one async all-gather per
parameter into ``torch.empty`` buffers and, before DeepSpeed PR #8539 (first in 0.19.8), waits only
on the last handle. On a CUDA stream the gathers complete in order; on gloo each runs on a thread
of its own, unordered, and the CPU accelerator's ``synchronize()`` does nothing, so a parameter can
be read before its gather arrived: uninitialized memory (NaN, denormals, 1e+37) or the previous
bytes. Nothing raises. Upstream saw 9 of 20 CPU CI runs fail; here it showed as NaN logits in the
fixed trainer's merge-before-sync check (F4) and as NaN losses in ZeRO-3 trainings, now and then.

bug:   tiny Qwen2, LoRA r=8 on q/v, bf16, DeepSpeed ZeRO-3 with every parameter partitioned, trained
       for the item's steps; then every rank gathers all parameters with ``GatheredParameters``, as
       a merge, a weight sync or a gathered save does (the largest launched second to last, the
       smallest last), up to ``GATHER_ROUNDS`` times, and compares each
       gathered parameter with the same partitions gathered one blocking all-gather at a time. A
       difference is ``GatheredParameterDiffers``. The gathers stop at the first round any rank saw
       one (a stress: it takes tens of rounds where the race exists, under load or not).
fixed: the same scenario with the fixed trainer's guards (``zero3-wait-every-gather`` where deepspeed
       < 0.19.8: every handle of the coalesced gather is waited on).

CPU only: on CUDA the gathers are ordered on one stream, and nothing here claims what it shows there. The
measured steps are the gather rounds (the training runs unmetered), so ``costs`` prices the guard per gather.
On a CPU every other repro's ZeRO-3 runs get the guard in every mode (``hazard_guards``): their outcomes must
not depend on this race.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from packaging.version import Version

from repros.catalog._stacks import CURRENT, TF4
from repros.runtime.context import Meters, RankContext
from repros.runtime.outcomes import Outcome
from repros.runtime.spec import Expectation, ReproSpec, Signature, Variant, WorldSizes
from repros.trainer.guards import GuardRule, Versions
from repros.trainer.scenario import Scenario

#: How many times every parameter is gathered after training (fewer where a difference is seen). Where the
#: race exists a round showed it about 1 time in 40 here (3 to 278 rounds to the first, 20 runs): 600 rounds
#: leave a miss about e^-15 likely, and cost ~6 s where there is nothing to find.
GATHER_ROUNDS = 600

# Established by running (2026-11-25, torch 2.13.0+cpu, peft 0.21.2, 2 ranks, gloo, the machine busy with other
# work): bug REPRODUCED in 20 of 20 runs on deepspeed 0.19.2 and 0.18.0 (+ transformers 4.57.6), at gather round
# 3 to 278 (median ~40; a layer norm or the final norm, a few of 64 elements stale or 1e+26), NOT_REPRODUCED in
# 10 of 10 on 0.19.8 (300 rounds each); fixed PASS on both; then the bisect below.
_ESTABLISHED = (
    "python -m harness run --cells ds-0.19.2,tf4-ds-0.18.0,current --repros F17 --repeat 10 (2026-11-25); then "
    "python -m harness bisect --repro F17 --mode bug --package deepspeed --good 0.19.8 --bad 0.19.2 --cell ds-0.19.2 "
    "-> first good: deepspeed==0.19.8 (5 steps, 430 s: 0.19.2, 0.19.5, 0.19.6, 0.19.7 REPRODUCED; 0.19.8 "
    "NOT_REPRODUCED)"
)

SPEC = ReproSpec(
    id="F17",
    title="ZeRO-3 on gloo reads a gathered parameter before its all-gather arrived",
    upstream=(
        "deepspeedai/DeepSpeed PR #8539 (fix: wait for every async all-gather of a coalesced gather; 0.19.8)",
        "deepspeedai/DeepSpeed#8381 (multi-rank CPU CI, where it showed)",
        "deepspeedai/DeepSpeed#8486 / PR #8487 (a handle waited twice marks a freed parameter AVAILABLE)",
    ),
    signatures=(
        Signature(
            id="F17.gathered-before-arrival",
            exception="repros.trainer.silent_failures.GatheredParameterDiffers",
            pattern=r"^gathered parameter \S+ differs from its partitions",
            description="no error, but a parameter GatheredParameters made whole differs from its partitions "
            "gathered one blocking all-gather at a time (NaN, garbage or stale values)",
        ),
    ),
    expectations=(
        Expectation(
            "bug",
            Outcome.REPRODUCED,
            {"deepspeed": "<0.19.8"},
            established_by=_ESTABLISHED,
            device="cpu",
            under=(CURRENT, TF4),
            observed={"deepspeed": ("0.18.0", "0.19.2", "0.19.5", "0.19.6", "0.19.7")},
        ),
        Expectation(
            "bug",
            Outcome.NOT_REPRODUCED,
            {"deepspeed": ">=0.19.8"},
            established_by=_ESTABLISHED,
            under=(CURRENT,),
            observed={"deepspeed": ("0.19.8",)},
            established_on="cpu",
        ),
        Expectation("fixed", Outcome.PASS, {}, established_by=_ESTABLISHED),
    ),
    variants=(
        Variant(
            "allgather-sequential",
            "ZeRO-3 stage3_allgather_sequential: true (one gather at a time, no coalescing)",
            {"zero3_allgather_sequential": True},
            claim="the catalog's earlier advice; DeepSpeed PR #7661 added the option",
        ),
        Variant(
            "wait-every-gather",
            "the fixed trainer's guard alone, on any deepspeed (what it costs where the race is fixed)",
            {"zero3_wait_every_gather": True},
            claim="DeepSpeed PR #8539 does the same inside the function",
        ),
    ),
    world_sizes=WorldSizes(2),
    world_sizes_why=(
        "with one rank ZeRO-3 has one partition and never all-gathers (DeepSpeed's `num_partitions == 1` "
        "path, `_no_gather_coalesced`): there is no gather to read early (ds-0.19.2, tf4-ds-0.18.0 at world "
        "size 1: NOT_REPRODUCED)"
    ),
    depends_on=("torch", "deepspeed", "peft", "transformers"),
    depends_on_why=(
        "ZeRO-3's (deepspeed) coalesced all-gather over torch's gloo collectives, for a transformers model with "
        "peft's adapters; the fixed trainer drives the engine itself, so accelerate takes no part, and nothing is "
        "quantized"
    ),
    description=__doc__ or "",
)


def run(ctx: RankContext) -> None:
    from repros.trainer import fixed_trainer
    from repros.trainer.scenario import Scenario
    from repros.trainer.variants import scenario_for

    scenario = Scenario(
        engine="deepspeed",
        zero_stage=3,
        # Every parameter partitioned: the gathers move every parameter, as for a real model's large ones.
        zero3_persistence_threshold=0,
        bf16=True,
        gradient_checkpointing=False,
    )
    scenario, guards = scenario_for(ctx, SPEC, scenario)
    # The measured steps are the gathers, not the training (so ``costs`` prices what the guard changes).
    trained = fixed_trainer.train(scenario, dataclasses.replace(ctx, meters=Meters([])), guards)
    gather_all_and_compare(trained.wrapped, ctx)


def gather_all_and_compare(engine: Any, ctx: RankContext, rounds: int = GATHER_ROUNDS) -> None:
    import deepspeed
    import torch
    import torch.distributed as dist

    from repros.trainer.silent_failures import GatheredParameterDiffers
    from repros.trainer.zero3_gathers import compare, partitions_gathered_in_full

    named = [(name, p) for name, p in engine.module.named_parameters() if hasattr(p, "ds_tensor")]
    # The largest parameter launched second to last, the smallest last: waiting on the last
    # handle (what DeepSpeed < 0.19.8 does) then says least about the others.
    by_size = sorted(range(len(named)), key=lambda i: int(named[i][1].ds_numel))
    tail = [by_size[-1], by_size[0]]
    named = [named[i] for i in range(len(named)) if i not in tail] + [named[i] for i in tail]
    names = [name for name, _ in named]
    params = [p for _, p in named]
    reference = partitions_gathered_in_full(params)
    seen: list[dict[str, Any]] = []
    seconds: list[float] = []
    done = 0
    ctx.meters.training_begins()
    for round_ in range(rounds):
        started = time.perf_counter()
        ctx.meters.resume()
        gathered = deepspeed.zero.GatheredParameters(params, modifier_rank=None)
        gathered.__enter__()
        ctx.meters.pause()
        seconds.append(time.perf_counter() - started)
        try:
            for i, param in enumerate(params):
                difference = compare(param.data, reference[i])
                if difference is not None and len(seen) < 5:
                    seen.append({"round": round_, "param": names[i], **difference})
        finally:
            ctx.meters.resume()
            gathered.__exit__(None, None, None)
            ctx.meters.pause()
            ctx.meters.end_step()
        done += 1
        # Every rank stops at the first round any rank saw a difference: the gathers are collectives.
        flag = torch.tensor([1 if seen else 0])
        dist.all_reduce(flag)
        if int(flag.item()):
            break
    seconds.sort()
    ctx.facts["gathers"] = {
        "parameters": len(params),
        "elements": sum(int(p.ds_numel) for p in params),
        "rounds": done,
        "of": rounds,
        "median_ms": round(1000 * seconds[len(seconds) // 2], 3) if seconds else None,
        "differences": seen,
    }
    if seen:
        first = seen[0]
        what = (
            f"{first['elements']} of {first['of']} elements differ, {first['nan']} NaN, "
            f"max |diff| {first['max_abs']:.3g}"
            if "elements" in first
            else f"shape {first['shape']}, expected {first['expected_shape']}"
        )
        raise GatheredParameterDiffers(
            f"gathered parameter {first['param']} differs from its partitions on rank {ctx.rank} in gather round "
            f"{first['round'] + 1} of {rounds}: {what} (read before its all-gather arrived)"
        )
    if dist.get_rank() == 0:
        print(f"F17: {done} gathers of {len(params)} parameters, each equal to its partitions", flush=True)


# The fixed trainer's workaround of this failure: chosen by repros/trainer/guards.py (in its order), listed in
# docs/guards.md.
#: First DeepSpeed release whose coalesced ZeRO-3 gather waits on every handle (PR #8539).
#: Established by running F17 (see repros/catalog/f17_zero3_gloo_gather_race.py).
DEEPSPEED_Z3_GATHER_WAIT_FIX = Version("0.19.8")


def _zero3_gather_race(s: Scenario, v: Versions) -> bool:
    deepspeed = v.get("deepspeed")
    return (
        s.engine == "deepspeed"
        and s.zero_stage == 3
        and not s.zero3_wait_every_gather
        and deepspeed is not None
        and deepspeed < DEEPSPEED_Z3_GATHER_WAIT_FIX
    )


GUARD = GuardRule(
    "zero3-wait-every-gather",
    "F17",
    _zero3_gather_race,
    {"zero3_wait_every_gather": True},
    lambda v: (
        f"deepspeed {v.get('deepspeed')} < {DEEPSPEED_Z3_GATHER_WAIT_FIX} waits only on the last all-gather of "
        "a coalesced ZeRO-3 gather; on gloo the others may not have arrived (F17, DeepSpeed PR #8539)"
    ),
    every_mode=True,
    explained=(
        "DeepSpeed before 0.19.8 waits only on the last of the async all-gathers of a coalesced ZeRO-3 parameter "
        "gather; on gloo they run unordered on threads of their own, so a parameter can be read before its gather "
        "arrived (F17, DeepSpeed PR #8539): wait on every handle. A hazard of CPU runs, not of a scenario: on a "
        "CPU it applies in every mode of every repro but F17's own (``hazard_guards``), so that no other repro's "
        "outcome depends on it."
    ),
)
