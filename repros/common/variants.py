"""The scenario a rank runs, and its guards, for the item it was given. Standard library only.

``bug`` runs the repro's documented scenario unguarded; ``fixed`` runs it through the fixed
trainer's guards; an item of ``costs`` names a variant (``ctx.params["variant"]``): the
documented scenario with the variant's overrides, guarded only if the variant says so.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from repros.common.guards import Guard, choose_guards
from repros.common.scenario import Scenario
from repros.common.spec import ReproSpec


def scenario_for(ctx: Any, spec: ReproSpec, documented: Scenario) -> tuple[Scenario, list[Guard]]:
    name = (getattr(ctx, "params", None) or {}).get("variant")
    if name:
        variant = spec.variant(str(name))
        scenario = replace(documented, **dict(variant.overrides))
        ctx.facts["variant"] = {"name": variant.name, "overrides": dict(variant.overrides), "guards": variant.guards}
        return scenario, choose_guards(scenario) if variant.guards else []
    return documented, choose_guards(documented) if ctx.mode == "fixed" else []
