"""F22 - ZeRO-3 reference model with sequential all-gathers: a released weight marked available.

RLHF and preference trainers (TRL's DPO, GRPO and RLOO under ZeRO-3) keep a frozen reference model
beside the policy and hand it to ``deepspeed.initialize`` without an optimizer. With
``stage3_allgather_sequential: true`` (DeepSpeed PR #7661, from 0.18.5) a prefetch then spans
several modules: the gather returns one handle of per-parameter ``AllGatherHandle``s, and the
coordinator registers that one object under every parameter it prefetched. Each module's fetch
waits it again, and before DeepSpeed PR #8487 (0.19.7) ``AllGatherHandle.wait`` was not idempotent:
a late wait marks the parameters of an earlier module, already released (``data`` an empty
tensor), AVAILABLE. Every later fetch trusts the flag and skips their gather, and the next matmul
gets a weight of zero elements: ``RuntimeError: size mismatch, got input (2048), mat (2048x4096),
vec (0)`` upstream (DeepSpeed#8486). A training engine does not show it: with an optimizer
DeepSpeed forces a prefetch of one parameter in sequential mode.

bug:   the policy, tiny Qwen2 with LoRA r=8 on q/v, bf16, trained by the fixed trainer under ZeRO-3
       (every parameter partitioned, ``stage3_allgather_sequential: true``); then the reference
       model, the same tiny Qwen2 frozen, given to ``deepspeed.initialize`` with the same config and
       no optimizer, in eval mode, runs ``REFERENCE_FORWARDS`` forwards of the training batch (what a
       DPO/GRPO step asks of it), each compared with the first.
fixed: the same scenario with the fixed trainer's guards (``zero3-gather-handles-wait-once`` where
       deepspeed < 0.19.7: a handle's second wait does nothing, as PR #8487 makes it).
"""

from __future__ import annotations

from typing import Any

from packaging.version import Version

from repros.catalog._stacks import CURRENT
from repros.runtime.context import RankContext
from repros.runtime.outcomes import Outcome
from repros.runtime.spec import Expectation, ReproSpec, Signature, Variant, WorldSizes
from repros.trainer.guards import GuardRule, Versions
from repros.trainer.scenario import Scenario

#: Forwards of the reference model after training (the third fails where the bug is).
REFERENCE_FORWARDS = 4

# Established by running (2026-11-25, torch 2.13.0+cpu, peft 0.21.2, transformers 5.23.0, 2 ranks, gloo): bug
# REPRODUCED on deepspeed 0.19.2 (the third forward: 'weight' must be 2-D, the embedding and every weight of the
# model empty while marked AVAILABLE), NOT_REPRODUCED on 0.19.8, fixed PASS on both; deepspeed 0.18.0 has no
# stage3_allgather_sequential (a ValidationError: the option came in 0.18.5, read in the sdists), so the cell
# with it excludes F22; then the bisect below.
_ESTABLISHED = (
    "python -m harness run --cells ds-0.19.2,current,tf4-ds-0.18.0 --repros F22 (2026-11-25); then python -m "
    "harness bisect --repro F22 --mode bug --package deepspeed --good 0.19.8 --bad 0.19.2 --cell ds-0.19.2 -> first "
    "good: deepspeed==0.19.7 (5 steps, 119 s: 0.19.2, 0.19.5, 0.19.6 REPRODUCED; 0.19.7, 0.19.8 NOT_REPRODUCED)"
)

SPEC = ReproSpec(
    id="F22",
    title="ZeRO-3 reference model with sequential all-gathers: a released weight marked available (vec (0))",
    upstream=(
        "deepspeedai/DeepSpeed#8486",
        "deepspeedai/DeepSpeed PR #8487 (fix: AllGatherHandle and NoGatherHandle wait once; 0.19.7)",
        "deepspeedai/DeepSpeed PR #7661 (stage3_allgather_sequential, from 0.18.5)",
    ),
    signatures=(
        Signature(
            id="F22.empty-weight",
            exception="RuntimeError",
            pattern=r"size mismatch, got input \(\d+\), mat \(\d+x\d+\), vec \(0\)"
            r"|mat2 must be a matrix, got 1-D tensor"
            r"|^'weight' must be 2-D$"
            r"|mat1 and mat2 shapes cannot be multiplied \(\d+x\d+ and 0x\d+\)"
            r"|shape '\[[^\]]*\]' is invalid for input of size 0",
            description="a forward of the reference model uses a weight ZeRO-3 had released (a 1-D tensor of 0 "
            "elements) because a late handle wait marked it available: DeepSpeed's linear upstream, the "
            "embedding here ('weight' must be 2-D)",
        ),
        Signature(
            id="F22.reference-forward-differs",
            exception="repros.trainer.silent_failures.ReferenceForwardDiffers",
            pattern=r"^the reference model's forward \d+ differs from its first",
            description="no error, but a later forward of the frozen reference model gives other logits than "
            "its first for the same batch",
        ),
    ),
    expectations=(
        Expectation(
            "bug",
            Outcome.REPRODUCED,
            {"deepspeed": ">=0.19.2,<0.19.7"},
            established_by=_ESTABLISHED,
            under=(CURRENT,),
            observed={"deepspeed": ("0.19.2", "0.19.5", "0.19.6")},
            established_on="cpu",
        ),
        Expectation(
            "bug",
            Outcome.NOT_REPRODUCED,
            {"deepspeed": ">=0.19.7"},
            established_by=_ESTABLISHED,
            under=(CURRENT,),
            observed={"deepspeed": ("0.19.7", "0.19.8")},
            established_on="cpu",
        ),
        Expectation("fixed", Outcome.PASS, {"deepspeed": ">=0.19.2"}, established_by=_ESTABLISHED),
    ),
    variants=(
        Variant(
            "coalesced-gathers",
            "ZeRO-3's default coalesced gathers (stage3_allgather_sequential off)",
            {"zero3_allgather_sequential": False},
            claim="DeepSpeed#8486 (the option is off by default)",
        ),
    ),
    world_sizes=WorldSizes(2),
    world_sizes_why=(
        "with one rank ZeRO-3 has one partition and never all-gathers (DeepSpeed's `num_partitions == 1` "
        "path, `_no_gather_coalesced`): no AllGatherHandle is waited twice (ds-0.19.2 at world size 1: "
        "NOT_REPRODUCED)"
    ),
    depends_on=("torch", "deepspeed", "peft", "transformers"),
    depends_on_why=(
        "ZeRO-3's (deepspeed) sequential gathers of a reference transformers model beside one with peft's adapters, "
        "on torch; the fixed trainer drives the engines itself, so accelerate takes no part, and nothing is quantized"
    ),
    description=__doc__ or "",
)


def run(ctx: RankContext) -> None:
    from repros.trainer import fixed_trainer
    from repros.trainer.guards import apply_guards
    from repros.trainer.scenario import Scenario
    from repros.trainer.variants import scenario_for

    scenario = Scenario(
        engine="deepspeed",
        zero_stage=3,
        zero3_persistence_threshold=0,
        zero3_allgather_sequential=True,
        bf16=True,
        gradient_checkpointing=False,
    )
    scenario, guards = scenario_for(ctx, SPEC, scenario)
    trained = fixed_trainer.train(scenario, ctx, guards)
    reference_forwards(apply_guards(scenario, guards), trained.batch, ctx)


def reference_forwards(scenario: Any, batch: Any, ctx: RankContext) -> None:
    """The frozen reference model as TRL prepares it under ZeRO-3: its own engine, no optimizer."""
    import deepspeed
    import torch

    from repros.trainer.fixed_trainer import deepspeed_config
    from repros.trainer.silent_failures import ReferenceForwardDiffers
    from repros.trainer.tiny_models import tiny_qwen2

    reference = tiny_qwen2(seed=0).requires_grad_(False)
    config = {**deepspeed_config(scenario), "train_micro_batch_size_per_gpu": int(batch.shape[0])}
    engine, *_ = deepspeed.initialize(model=reference, config=config)
    engine.eval()
    logits: list[Any] = []
    facts: dict[str, Any] = {"forwards": REFERENCE_FORWARDS, "zero_optimization": config["zero_optimization"]}
    ctx.facts["reference"] = facts
    with torch.no_grad():
        for n in range(REFERENCE_FORWARDS):
            try:
                logits.append(engine(input_ids=batch).logits.float())
            except RuntimeError:
                # Which weights are empty while ZeRO-3 says they are there.
                facts["failed_at_forward"] = n + 1
                facts["empty_but_available"] = [
                    name
                    for name, p in engine.module.named_parameters()
                    if p.data.numel() == 0 and getattr(getattr(p, "ds_status", None), "name", "") == "AVAILABLE"
                ]
                raise
            if n and not torch.equal(logits[n], logits[0]):
                raise ReferenceForwardDiffers(
                    f"the reference model's forward {n + 1} differs from its first for the same batch "
                    f"(max |diff| {float((logits[n] - logits[0]).abs().nan_to_num(float('inf')).max()):.3g})"
                )


# The fixed trainer's workaround of this failure: chosen by repros/trainer/guards.py (in its order), listed in
# docs/guards.md.
#: First DeepSpeed release whose single-parameter gather handles wait once (PR #8487).
#: Established by running F22 (see repros/catalog/f22_zero3_sequential_handle_rewait.py).
DEEPSPEED_Z3_HANDLE_WAIT_ONCE_FIX = Version("0.19.7")


def _zero3_handle_rewait(s: Scenario, v: Versions) -> bool:
    deepspeed = v.get("deepspeed")
    return (
        s.engine == "deepspeed"
        and s.zero_stage == 3
        and s.zero3_allgather_sequential
        and not s.zero3_handles_wait_once
        and deepspeed is not None
        and deepspeed < DEEPSPEED_Z3_HANDLE_WAIT_ONCE_FIX
    )


GUARD = GuardRule(
    "zero3-gather-handles-wait-once",
    "F22",
    _zero3_handle_rewait,
    {"zero3_handles_wait_once": True},
    lambda v: (
        f"deepspeed {v.get('deepspeed')} < {DEEPSPEED_Z3_HANDLE_WAIT_ONCE_FIX} with sequential ZeRO-3 gathers "
        "waits a handle once per parameter and marks released ones available (F22, DeepSpeed#8486)"
    ),
    explained=(
        "DeepSpeed before 0.19.7 with ``stage3_allgather_sequential`` registers one gather handle under every "
        "parameter of a prefetch and waits it once per parameter; a late wait marks a parameter already released "
        "AVAILABLE, and the next forward multiplies with an empty weight (F22, DeepSpeed#8486): make a handle's "
        "second wait do nothing (PR #8487)."
    ),
)
