"""F6 - DDP + reentrant gradient checkpointing + LoRA: a parameter "marked as ready twice".

``DistributedDataParallel(find_unused_parameters=True)`` walks the autograd graph after each
forward and marks every parameter it cannot reach ready at once. A reentrant checkpoint hides its
block's parameters from that graph (the block runs under ``no_grad`` in the forward), so DDP marks
the adapters inside ready after the forward, and again when the recompute's own backward reaches
them: ``RuntimeError: Expected to mark a variable ready only once ... Parameter at index N with
name ...lora_B... has been marked as ready twice``. HF Trainer passes ``find_unused_parameters=True``
for a PEFT model under checkpointing (its ``not model.is_gradient_checkpointing`` rule only applies
to a ``PreTrainedModel``), and transformers 4.x checkpoints reentrantly by default; transformers 5
defaults to non-reentrant checkpointing (transformers PR #27020 made ``use_reentrant`` settable).

bug:   tiny Qwen2, ``gradient_checkpointing_enable()`` with no arguments (the library's default),
       then LoRA r=8 on q/v by ``get_peft_model`` (which makes the embedding output require grad),
       ``DistributedDataParallel(find_unused_parameters=True)`` as HF Trainer builds it, bf16
       autocast, a torch AdamW.
fixed: the same scenario through the fixed trainer's guards (``ddp-static-graph``).

Not F6: the same RuntimeError for a parameter used outside ``forward`` (reason 1 of its text, e.g.
weights shared between two forward passes) names a parameter that is no adapter, or comes from a
run without reentrant checkpointing; and with checkpointing enabled after ``get_peft_model`` and no
input grads, transformers 4.x fails first with F5's "element 0 of tensors does not require grad".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from repros.catalog._stacks import CURRENT, TF4, TORCH_2_0_TF4_40, TORCH_2_12_TF4
from repros.runtime.context import RankContext
from repros.runtime.outcomes import Outcome
from repros.runtime.spec import Expectation, ReproSpec, Signature
from repros.trainer.guards import GuardRule, Versions, checkpoints_reentrantly
from repros.trainer.scenario import Scenario

#: The parameter torch names, where it does (torch >= 2.1 by default; 2.0 only with
#: ``TORCH_DISTRIBUTED_DEBUG`` set).
_NAMED = re.compile(r"Parameter at index \d+ with name (?P<name>\S+) has been marked as ready twice")
_UNNAMED = re.compile(r"Parameter at index \d+ has been marked as ready twice")
#: What only an adapter's parameter is called (PEFT LoRA / DoRA, DeepSpeed-Chat LoRA).
_ADAPTER_PART = re.compile(r"(?:^|\.)(?:lora_[A-Za-z_]+|lora_magnitude_vector|modules_to_save)(?:\.|$)")

# Established by running (2026-11-23, torch 2.13.0+cpu, peft 0.21.2, 2 ranks, gloo): transformers
# 4.57.6 REPRODUCED (rank 0: "... with name base_model.model.model.layers.1.self_attn.v_proj.lora_B
# .default.weight has been marked as ready twice"), 5.23.0 NOT_REPRODUCED, fixed PASS in both; then
# bisect put the boundary at 5.0.0, whose gradient_checkpointing_enable() defaults to
# use_reentrant=False (4.57.6: True). No torch boundary: torch 2.0.1 (transformers 4.40.2, peft
# 0.10.0) REPRODUCED too, naming no parameter, and plain torchrun runs saw it on every torch tried
# (2.0.1, 2.1.2, 2.2.2, 2.4.1, 2.12.1, 2.13.0, 2.14.1).
_ESTABLISHED = (
    "python -m harness run --matrix M --repros F6, M = matrix.yaml's defaults with cells current, "
    "transformers==4.57.6, and torch==2.0.1 + transformers==4.40.2 + peft==0.10.0 + accelerate==0.29.3 without "
    "deepspeed and bitsandbytes (2026-11-23); then python -m harness bisect --repro F6 --mode bug --package "
    "transformers --good 5.23.0 --bad 4.57.6 --cell tf4 -> first good: transformers==5.0.0 (7 steps, 472 s: "
    "4.57.6 REPRODUCED; 5.0.0, 5.1.0, 5.4.0, 5.5.4, 5.11.0, 5.23.0 NOT_REPRODUCED)"
)


def names_an_adapter_twice_ready(message: str) -> bool:
    """The text says which parameter was marked ready twice, and it is an adapter's, or (torch
    2.0's wording) it gives only its index."""
    named = _NAMED.search(message)
    if named:
        return bool(_ADAPTER_PART.search(named.group("name")))
    return bool(_UNNAMED.search(message))


def ddp_under_reentrant_checkpointing(facts: Mapping[str, Any]) -> bool:
    """The failing run was DDP with reentrant checkpointing and adapters to train: F6's cause,
    not a parameter used outside ``forward``."""
    return (
        facts.get("engine") == "ddp"
        and facts.get("checkpointing") == "reentrant"
        and int(facts.get("trainable_parameters") or 0) > 0
    )


SPEC = ReproSpec(
    id="F6",
    title="DDP + reentrant checkpointing + LoRA: parameter marked as ready twice",
    upstream=(
        "huggingface/peft#313",
        "huggingface/peft#742",
        "huggingface/peft#1745",
        "huggingface/transformers#23728",
        "huggingface/accelerate#2017",
        "huggingface/trl#921",
        "artidoro/qlora#223",
        "huggingface/transformers PR #27020 (use_reentrant settable; 5.0 defaults to non-reentrant)",
    ),
    signatures=(
        Signature(
            id="F6.marked-ready-twice",
            exception="RuntimeError",
            pattern=r"Expected to mark a variable ready only once",
            checks=(names_an_adapter_twice_ready,),
            facts_checks=(ddp_under_reentrant_checkpointing,),
            description="DDP's reducer: an adapter parameter (torch >= 2.1 names it; torch 2.0 gives only its "
            "index) marked ready twice, in a DDP run with reentrant checkpointing",
        ),
    ),
    expectations=(
        Expectation(
            "bug",
            Outcome.REPRODUCED,
            {"transformers": "<5.0.0.dev0"},
            established_by=_ESTABLISHED,
            under=(TF4, TORCH_2_12_TF4, TORCH_2_0_TF4_40),
            observed={"transformers": ("4.40.2", "4.57.6")},
            established_on="cpu",
        ),
        Expectation(
            "bug",
            Outcome.NOT_REPRODUCED,
            {"transformers": ">=5.0.0.dev0"},
            established_by=_ESTABLISHED,
            under=(CURRENT,),
            observed={"transformers": ("5.0.0", "5.1.0", "5.4.0", "5.5.4", "5.11.0", "5.23.0")},
            established_on="cpu",
        ),
        Expectation("fixed", Outcome.PASS, {}, established_by=_ESTABLISHED),
    ),
    depends_on=("torch", "peft", "transformers"),
    depends_on_why=(
        "torch's DDP reducer meets transformers' reentrant checkpoint of peft's adapters; no DeepSpeed, accelerate or "
        "bitsandbytes runs"
    ),
    description=__doc__ or "",
)


def run(ctx: RankContext) -> None:
    from repros.trainer.fixed_trainer import train
    from repros.trainer.scenario import Scenario
    from repros.trainer.variants import scenario_for

    scenario = Scenario(
        engine="ddp",
        bf16=True,
        gradient_checkpointing=True,
        use_reentrant=None,
        checkpointing_before_adapter=True,
        ddp_find_unused_parameters=True,
    )
    scenario, guards = scenario_for(ctx, SPEC, scenario)
    train(scenario, ctx, guards)


# The fixed trainer's workaround of this failure: chosen by repros/trainer/guards.py (in its order), listed in
# docs/guards.md.
def _ddp_reentrant_unused_search(s: Scenario, v: Versions) -> bool:
    return (
        s.engine == "ddp" and s.ddp_find_unused_parameters and not s.ddp_static_graph and checkpoints_reentrantly(s, v)
    )


GUARD = GuardRule(
    "ddp-static-graph",
    "F6",
    _ddp_reentrant_unused_search,
    {"ddp_static_graph": True},
    lambda v: "DDP's unused-parameter search marks adapters under reentrant checkpointing ready twice (F6)",
    explained=(
        "DDP with ``find_unused_parameters=True`` under reentrant checkpointing marks each checkpointed adapter "
        "ready once after the forward (unused: the checkpoint hides it) and again in the recompute's backward "
        "(F6); declare the graph static (``static_graph=True``), which keeps the user's checkpointing and "
        "unused-parameter search."
    ),
)
