"""The scenario a rank runs, and its guards, for the item it was given. Standard library only.

``bug`` runs the repro's documented scenario unguarded (but for the CPU machine's own hazards:
``hazard_guards``); ``fixed`` runs it through the fixed trainer's guards; an item of ``costs``
names a variant (``ctx.params["variant"]``): the documented scenario with the variant's
overrides, guarded only if the variant says so.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from repros.runtime.spec import ReproSpec
from repros.trainer.guards import Guard, choose_guards, hazard_guards
from repros.trainer.scenario import Scenario


def scenario_for(ctx: Any, spec: ReproSpec, documented: Scenario) -> tuple[Scenario, list[Guard]]:
    name = (getattr(ctx, "params", None) or {}).get("variant")
    if name:
        variant = spec.variant(str(name))
        scenario = replace(documented, **dict(variant.overrides))
        ctx.facts["variant"] = {"name": variant.name, "overrides": dict(variant.overrides), "guards": variant.guards}
        return scenario, choose_guards(scenario) if variant.guards else unguarded(ctx, spec, scenario)
    return documented, choose_guards(documented) if ctx.mode == "fixed" else unguarded(ctx, spec, documented)


def unguarded(ctx: Any, spec: ReproSpec, scenario: Scenario) -> list[Guard]:
    """A scenario as users wrote it: no workaround, but the CPU machine's own hazards guarded
    (F17's gather race, except in F17)."""
    device = getattr(ctx, "device_type", None) or "cpu"
    return hazard_guards(scenario, str(device), spec.id)
