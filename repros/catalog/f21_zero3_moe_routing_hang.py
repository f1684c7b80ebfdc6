"""F21 - ZeRO-3 mixture-of-experts: ranks that route tokens to different experts hang.

ZeRO-3 gathers a module's parameters in the module's forward (and backward) pre-hook, with an
all-gather every rank must join in the same order. transformers 4.x's MoE blocks (Mixtral,
Qwen2-MoE, ...) keep each expert a module of its own and call only the experts some token of the
batch was routed to. Each rank routes its own tokens: where an expert gets tokens on one rank and
none on another, the ranks issue different gathers, their all-gathers pair with the wrong partners,
and training stops: on NCCL a rank waits until the watchdog's timeout (30 minutes by default;
"Watchdog caught collective operation timeout: WorkNCCL(... OpType=_ALLGATHER_BASE ...)"), on gloo
a rank aborts on the size mismatch ("op.preamble.length <= op.nbytes ... Is there a distributed
collective mismatch in your code?", SIGABRT). DeepSpeed PR #4966 (0.13.x) added leaf modules,
``deepspeed.utils.set_z3_leaf_modules``: a leaf's pre-hook gathers all of its parameters (every
expert) and its children get no hooks; PR #7604 (0.18.0) marks Mixtral's, Qwen2-MoE's and
Qwen3-MoE's blocks leaves by default (``zero_optimization.leaf_module``). transformers 5 keeps a
layer's experts in one module (3D weights), gathered whole whatever the routing.

Families: in the default family (``qwen2``, dense) the repro trains a Mixtral; in ``qwen2-moe`` the
family's own Qwen2-MoE with as many experts (``moe_test_model``), whose transformers 4.x block also
calls only the experts with tokens; the other families are dense and cannot have it.

bug:   a tiny Mixtral (the test model's widths, 2 layers of 32 experts, 2 per token), LoRA r=8 on
       q/v, bf16, ZeRO-3 with every parameter partitioned (a real model's experts are far above
       the persistence threshold), each rank its own batch of 32 tokens (so each rank leaves some
       experts without tokens, not the same ones), the fixed trainer's own loop.
fixed: the same scenario through the fixed trainer's guards (``zero3-moe-leaf-modules`` where
       deepspeed < 0.18.0 with transformers < 5: the MoE blocks are made leaf modules).

The hang, bounded: before each ZeRO-3 fetch of a module's parameters every rank compares, through
the process group's store (not a collective), which module it is about to gather with the other
ranks' (``repros/trainer/moe.py``); where they differ, or another rank does not get there within
``GATHER_WAIT_S``, it raises ``ZeRO3GathersDiverged`` naming both modules instead of waiting for a
watchdog (or gloo's abort, which a record cannot hold). The check changes nothing the ranks compute;
it runs in every mode. Before training, each rank records which experts its batch reaches
(``moe_routing`` in its facts).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packaging.version import Version

from repros.catalog._stacks import CURRENT, DS_0_19_2, TF4_DS_0_17, TF4_DS_0_18, stack
from repros.runtime.context import RankContext
from repros.runtime.outcomes import Outcome
from repros.runtime.spec import Expectation, ReproSpec, Signature, WorldSizes
from repros.trainer.guards import GuardRule, Versions
from repros.trainer.scenario import Scenario

#: How long a rank waits at a gather for the other ranks to say which module they gather.
GATHER_WAIT_S = 60

SCENARIO = Scenario(
    engine="deepspeed",
    zero_stage=3,
    bf16=True,
    gradient_checkpointing=False,
    zero3_persistence_threshold=0,
    moe_experts=32,
)

# Established by running (2026-11-26, torch 2.13.0+cpu, peft 0.21.2, 2 ranks, gloo): bug REPRODUCED on deepspeed
# 0.17.6 + transformers 4.57.6 (without the check: CRASH, gloo's abort), NOT_REPRODUCED on 0.18.0 + 4.57.6, 0.19.8
# + 4.57.6 and 0.19.3 + 5.23.0; fixed PASS in all; then the bisect below. Not run: deepspeed 0.17.6 with
# transformers 5 (the transformers side rests on ds-0.19.3 and the modeling code).
_ESTABLISHED = (
    "python -m harness run --cells ds-0.19.2,current,ds-0.19.3,tf4-ds-0.18.0,tf4-ds-0.17.6 --repros F12,F13,F21 "
    "--jobs 1 (2026-11-26); python -m harness bisect --repro F21 --mode bug --package deepspeed --good 0.18.0 "
    "--bad 0.17.6 --cell tf4-ds-0.17.6 -> first good: deepspeed==0.18.0 (2 steps, 106 s; adjacent releases)"
)


def moe_without_leaf_modules(facts: Mapping[str, Any]) -> bool:
    """The failing rank trained a mixture-of-experts model under DeepSpeed with its MoE blocks not
    made leaf modules by the scenario (DeepSpeed's own defaults aside)."""
    return (
        facts.get("engine") == "deepspeed"
        and int(facts.get("moe_experts") or 0) > 0
        and not facts.get("zero3_moe_leaf_modules")
    )


#: Why a dense family cannot have it (the default family's run trains a Mixtral instead).
_DENSE = "a dense model: every rank runs the same MLP weights whatever its tokens route to, so its gathers always pair"

SPEC = ReproSpec(
    id="F21",
    title="ZeRO-3 mixture-of-experts: ranks that route tokens to different experts hang",
    upstream=(
        "deepspeedai/DeepSpeed#4808",
        "deepspeedai/DeepSpeed PR #4966 (set_z3_leaf_modules) and PR #5008",
        "deepspeedai/DeepSpeed PR #7604 (0.18.0: Mixtral and Qwen2/3-MoE blocks leaf modules by default)",
        "hiyouga/LlamaFactory#2315",
    ),
    signatures=(
        Signature(
            id="F21.gathers-diverged",
            exception="repros.trainer.moe.ZeRO3GathersDiverged",
            pattern=r"^ZeRO-3 ranks gather different modules' parameters",
            facts_checks=(moe_without_leaf_modules,),
            description="ranks about to gather different modules' parameters (the hang, caught before it)",
        ),
        Signature(
            id="F21.nccl-allgather-timeout",
            exception="torch.distributed.DistBackendError",
            aliases=("RuntimeError",),
            pattern=r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=\d+, OpType=_ALLGATHER_BASE",
            facts_checks=(moe_without_leaf_modules,),
            description="on NCCL: a ZeRO-3 all-gather of an MoE model timed out (the hang, after the watchdog's "
            "timeout)",
        ),
    ),
    expectations=(
        Expectation(
            "bug",
            Outcome.REPRODUCED,
            {"deepspeed": "<0.18.0", "transformers": "<5.0.0.dev0"},
            established_by=_ESTABLISHED,
            under=(TF4_DS_0_17,),
            observed={"deepspeed": ("0.17.6",), "transformers": ("4.57.6",)},
            established_on="cpu",
        ),
        Expectation(
            "bug",
            Outcome.NOT_REPRODUCED,
            {"deepspeed": ">=0.18.0"},
            established_by=_ESTABLISHED,
            note="PR #7604: DeepSpeed makes Mixtral's MoE blocks ZeRO-3 leaf modules by default",
            under=(TF4_DS_0_18,),
            observed={"deepspeed": ("0.18.0",)},
            established_on="cpu",
        ),
        Expectation(
            "bug",
            Outcome.NOT_REPRODUCED,
            {"transformers": ">=5.0.0.dev0"},
            established_by=_ESTABLISHED,
            note="transformers 5 keeps a layer's experts in one module, gathered whole",
            under=(CURRENT, stack(deepspeed="0.19.3"), DS_0_19_2),
            observed={"transformers": ("5.23.0",)},
            established_on="cpu",
        ),
        Expectation("fixed", Outcome.PASS, {}, established_by=_ESTABLISHED),
    ),
    impossible_in={family: _DENSE for family in ("llama", "mistral", "gemma2", "phi3", "llava")},
    world_sizes=WorldSizes(2),
    world_sizes_why=(
        "ranks whose tokens reach different experts gather different modules' parameters: one rank cannot "
        "disagree with itself (tf4-ds-0.17.6 at world size 1: NOT_REPRODUCED)"
    ),
    depends_on=("torch", "deepspeed", "peft", "transformers"),
    depends_on_why=(
        "ZeRO-3 (deepspeed) gathers the experts of a transformers mixture of experts on torch's collectives, with "
        "peft's adapters; the fixed trainer drives the engine itself, so accelerate takes no part, and nothing is "
        "quantized"
    ),
    description=__doc__ or "",
)


def run(ctx: RankContext) -> None:
    from dataclasses import replace

    import torch.distributed as dist

    from repros.runtime.model_size import current_size
    from repros.trainer.fixed_trainer import train
    from repros.trainer.model import training_batch
    from repros.trainer.moe import check_gathers_in_step, experts_routed
    from repros.trainer.tiny_models import moe_test_model
    from repros.trainer.variants import scenario_for

    scenario, guards = scenario_for(ctx, SPEC, SCENARIO)
    size = current_size()
    sized = replace(
        scenario, batch_size=scenario.batch_size or size.batch_size, seq_len=scenario.seq_len or size.seq_len
    )
    mine = experts_routed(moe_test_model(scenario.moe_experts), training_batch(sized, ctx.rank))
    every: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(every, mine)
    ctx.facts["moe_routing"] = [
        {
            "layer": layer,
            "experts_per_rank": [every[r][layer] for r in range(ctx.world_size)],
            "experts_some_rank_leaves_out": sorted(
                set().union(*(every[r][layer] for r in range(ctx.world_size)))
                - set.intersection(*(set(every[r][layer]) for r in range(ctx.world_size)))
            ),
        }
        for layer in range(len(mine))
    ]
    check_gathers_in_step(GATHER_WAIT_S)
    train(scenario, ctx, guards)


# The fixed trainer's workaround of this failure: chosen by repros/trainer/guards.py (in its order), listed in
# docs/guards.md.
#: First DeepSpeed release that makes Mixtral's and Qwen2/3-MoE's MoE blocks ZeRO-3 leaf modules by
#: default (PR #7604). Bisected by F21 (repros/catalog/f21_zero3_moe_routing_hang.py).
DEEPSPEED_Z3_MOE_DEFAULT_LEAF = Version("0.18.0")

#: transformers 5 keeps each MoE layer's experts in one module (fused 3D weights): gathered whole.
TRANSFORMERS_FUSED_EXPERTS = Version("5.0.0.dev0")


def _zero3_moe_routing_diverges(s: Scenario, v: Versions) -> bool:
    deepspeed, transformers = v.get("deepspeed"), v.get("transformers")
    return (
        s.engine == "deepspeed"
        and s.zero_stage == 3
        and (s.moe_experts > 0 or s.model_family().moe)
        and not s.zero3_moe_leaf_modules
        and deepspeed is not None
        and deepspeed < DEEPSPEED_Z3_MOE_DEFAULT_LEAF
        and transformers is not None
        and transformers < TRANSFORMERS_FUSED_EXPERTS
    )


GUARD = GuardRule(
    "zero3-moe-leaf-modules",
    "F21",
    _zero3_moe_routing_diverges,
    {"zero3_moe_leaf_modules": True},
    lambda v: (
        f"deepspeed {v.get('deepspeed')} < {DEEPSPEED_Z3_MOE_DEFAULT_LEAF} with transformers "
        f"{v.get('transformers')} gathers only the experts a rank's tokens reach: ranks that route "
        "differently hang (F21, DeepSpeed#4808)"
    ),
    explained=(
        "under ZeRO-3 an MoE block whose experts are modules of their own (transformers 4.x) gathers only the "
        "experts its rank's tokens reach; ranks that route differently issue different all-gathers and hang (F21, "
        "DeepSpeed#4808); mark the MoE blocks leaf modules (``deepspeed.utils.set_z3_leaf_modules``), as "
        "DeepSpeed itself does for Mixtral and Qwen2/3-MoE from 0.18.0 on (PR #7604). It applies to a Mixtral "
        "scenario (``moe_experts``) and to an item of an MoE family (Qwen2-MoE: its ``Qwen2MoeSparseMoeBlock`` is "
        "marked leaf)."
    ),
)
