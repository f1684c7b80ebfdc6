"""One strategy trained on the item's ranks and held against the one-process reference: the reference first
(rank 0, alone), then the strategy (every rank), its adapter saved, reloaded and merged, and rank 0 judges.

What it found goes into ``ctx.facts["crosscheck"]`` (both trajectories' losses, gradient norms and optimizer
steps, the divergence or the closest call, the reference it was held to and the tolerance); a divergence is
raised as ``TrainsUnlikeOneProcess`` on rank 0, naming the first step, the quantity, the tensor, both values,
the relative difference and the tolerance, so that a documented failure's signature can name it like any other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from repros.runtime.context import RankContext
from repros.runtime.record import ScenarioUnavailable
from repros.trainer.crosscheck import after, compare
from repros.trainer.crosscheck.strategy import DIVERGENCE_SAYS, Strategy
from repros.trainer.crosscheck.tolerance import Tolerance
from repros.trainer.crosscheck.training import (
    Breakage,
    micro_batch,
    scenario_of,
    tokens_per_step,
    train_reference,
    train_strategy,
    width,
)
from repros.trainer.scenario import Scenario
from repros.trainer.silent_failures import TrainsUnlikeOneProcess

#: Steps trained when the item does not say.
DEFAULT_STEPS = 4

_REGIMES = {
    "fp32": "float32 weights and compute",
    "bf16-autocast": "float32 weights, bf16 compute under autocast",
    "bf16-weights": "the model in bf16, float32 master weights in the optimizer",
}


def reference_description(strategy: Strategy, world: int) -> dict[str, Any]:
    """What the strategy is held to, and where that reference differs from plain float32 on purpose."""
    described: dict[str, Any] = {
        "processes": 1,
        "regime": strategy.regime,
        "precision": _REGIMES[strategy.regime],
        "checkpointing": "none",
        "accumulation": (
            f"none: the global batch ({world} ranks x {strategy.micro_batches} micro-batches) in one forward"
        ),
        "adapter": strategy.adapter,
        "optimizer": strategy.optimizer,
    }
    if strategy.regime != "fp32":
        described["same_property"] = (
            f"the reference computes in bf16 as the strategy does ({_REGIMES[strategy.regime]}): a strategy is held "
            "to what its precision allows, and its tolerance adds bf16's unit"
        )
    return described


def _trajectory_facts(trajectory: Any) -> dict[str, Any]:
    from repros.trainer.model import json_number

    return {
        "loss": [json_number(v) for v in trajectory.losses],
        "grad_norm": [json_number(v) for v in trajectory.grad_norms],
        "optimizer_steps": list(trajectory.optimizer_steps),
    }


def _train_facts(trajectory: Any) -> dict[str, Any]:
    """The fixed trainer's training facts (``model.train_facts``) of the strategy's trajectory."""
    from repros.trainer.model import train_facts

    norms = {
        name: [None if g[name] is None else float(g[name].norm()) for g in trajectory.gradients]
        for name in trajectory.initial
    }
    return train_facts(
        trajectory.losses, norms, trajectory.initial, trajectory.weights[-1] if trajectory.weights else {}
    )


def crosscheck(
    ctx: RankContext,
    strategy: Strategy,
    seed: int,
    steps: int,
    breakage: Breakage | None = None,
    overrides: Callable[[Scenario], Scenario] | None = None,
) -> compare.Verdict | None:
    """Train ``strategy`` and its reference, compare, and raise ``TrainsUnlikeOneProcess`` on rank 0 where
    they differ. Returns the verdict on rank 0 (None on the others). ``overrides`` changes the strategy's
    scenario (never the reference's): a documented failure's configuration, the fixed trainer's guards."""
    import torch.distributed as dist

    from repros.trainer import adapter_io

    breakage = breakage or Breakage()
    world = dist.get_world_size() if dist.is_initialized() else 1
    facts: dict[str, Any] = {
        "strategy": strategy.name,
        "strategy_parts": strategy.parts(),
        "seed": seed,
        "steps": steps,
        "world_size": world,
        "reference": reference_description(strategy, world),
        "break": breakage.kind,
    }
    ctx.facts["crosscheck"] = facts
    ctx.facts["scenario_facts"] = {**strategy.parts(), "world_size": world}
    reference = None
    if ctx.rank == 0:
        try:
            reference, _ = train_reference(strategy, ctx, seed, steps, world)
        except ScenarioUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - the reference failing is the cell's, not the strategy's
            raise ScenarioUnavailable(
                f"the one-process reference of {strategy.name} could not train in this cell, so nothing can be "
                f"compared: {type(exc).__name__}: {exc}"
            ) from exc
        facts["reference_trajectory"] = _trajectory_facts(reference)
    if dist.is_initialized():
        dist.barrier()
    trajectory, engine = train_strategy(strategy, ctx, seed, steps, breakage, overrides)
    facts["trajectory"] = _trajectory_facts(trajectory)
    ctx.facts["train"] = _train_facts(trajectory)
    scenario = scenario_of(strategy, seed)
    with adapter_io.shared_workdir() as work:
        out = work / "adapter"
        after.save(strategy, scenario, engine, out, ctx.rank)
        if ctx.rank != 0:
            return None
        assert reference is not None
        if breakage.kind == "unsaved-tensor":
            facts["dropped_tensor"] = after.drop_one_tensor(out)
        tolerance = Tolerance(
            strategy.regime, tokens_per_step(world, strategy), width(engine.model), adaptive=strategy.adaptive
        )
        facts["tolerance"] = tolerance.describe()
        names = list(reference.initial)
        stored = after.saved_precision(out)
        saved, reloaded = after.reload(scenario, out, names)
        reference_model = after.reference_adapter(scenario, reference.weights[-1])
        probe = micro_batch(seed, 10_000, 0)
        found = after.outputs(scenario, reloaded, reference_model, probe)
    differences = [
        *compare.step_differences(trajectory, reference, tolerance),
        *compare.after_differences(
            saved, reference.weights[-1], reference.initial, found, tolerance, steps - 1, stored
        ),
    ]
    verdict = compare.judge(iter(differences))
    facts.update(verdict.as_json())
    if verdict.divergence is not None:
        ctx.facts["scenario_facts"]["quantity"] = verdict.divergence.quantity
        raise TrainsUnlikeOneProcess(
            f"{strategy.name}{DIVERGENCE_SAYS}{verdict.divergence.describe()} "
            f"({verdict.compared} quantities compared; the reference: one process, {_REGIMES[strategy.regime]})"
        )
    return verdict


def crosscheck_repro(
    ctx: RankContext,
    spec: Any,
    strategy: Strategy,
    documented: Callable[[Scenario], Scenario] = lambda s: s,
    seed: int = 0,
) -> compare.Verdict | None:
    """A documented failure that trains, only otherwise than one process: ``strategy`` with the failure's
    configuration (``documented`` changes the strategy's scenario), as users wrote it in ``bug`` mode, through
    the fixed trainer's guards in ``fixed`` mode, held against one process. A divergence raises
    ``TrainsUnlikeOneProcess`` for the failure's signature to name; agreeing is the fixed trainer's PASS
    (``pass_rule="agrees"``). It trains the repro's ``steps``."""
    from repros.trainer.guards import apply_guards
    from repros.trainer.variants import scenario_for

    scenario, guards = scenario_for(ctx, spec, documented(scenario_of(strategy, seed)))
    ctx.facts["guards"] = [{"id": g.id, "reason": g.reason} for g in guards]
    chosen = apply_guards(scenario, guards)
    return crosscheck(ctx, strategy, seed, ctx.steps, overrides=lambda _: chosen)
