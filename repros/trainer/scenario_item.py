"""A grid combination as users write it: the scenario its axes describe, trained and then used
as users use a trained adapter (``repros/trainer/after_training.py``).

Not a documented failure of its own (it is not in the ``repros`` package's top level, so it is
never discovered as a repro): the orchestrator launches it for ``grid`` items and classifies
what happens against every repro's signatures. ``ctx.params["scenario"]`` is the combination
(axis -> value); in ``fixed`` mode the fixed trainer's guards apply (does it train then?).
"""

from __future__ import annotations

from repros.runtime.context import RankContext
from repros.runtime.spec import ReproSpec

SPEC = ReproSpec(
    id="grid-combination",
    title="a combination of the config grid, as users write it",
    upstream=(),
    signatures=(),
    expectations=(),
)


def run(ctx: RankContext) -> None:
    from dataclasses import replace

    from repros.trainer.after_training import after_training
    from repros.trainer.fixed_trainer import train
    from repros.trainer.grid_axes import scenario_overrides
    from repros.trainer.guards import apply_guards, choose_guards, hazard_guards
    from repros.trainer.scenario import Scenario
    from repros.trainer.silent_failures import (
        raise_if_layer_adapters_got_no_gradient,
        raise_if_vision_adapters_got_no_gradient,
    )

    scenario = replace(Scenario(), **scenario_overrides(ctx.params["scenario"]))
    guards = choose_guards(scenario) if ctx.mode == "fixed" else hazard_guards(scenario, ctx.device_type, SPEC.id)
    ctx.facts["combination"] = dict(ctx.params["scenario"])
    if scenario.after_training == "sync":
        # The sync target runs the engine's model: train that one (weight_sync.training_the_engine_model).
        from repros.trainer import weight_sync

        with weight_sync.training_the_engine_model():
            trained = train(scenario, ctx, guards)
        weight_sync.check_engine_model(trained.model)
    else:
        trained = train(scenario, ctx, guards)
    # A LoRA by plain names on a vision-language model (F23): its vision tower's adapters that never reach the
    # loss are the finding, not the decoder layers' (whose check would name F5's silent form for them).
    raise_if_vision_adapters_got_no_gradient(ctx.facts["train"])
    raise_if_layer_adapters_got_no_gradient(ctx.facts["train"])
    after_training(trained, apply_guards(scenario, guards), ctx)
