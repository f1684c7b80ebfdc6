"""The config grid's items: the combinations a lane covers (``pairwise`` by covertable, which
honours the exclusions as constraints and refuses to leave a pair uncovered; or ``product``), with
``--only`` applied, each planned in every selected cell to run as users write it."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

from harness.config.grid import Combination, Grid
from harness.config.matrix import Cell
from harness.core.errors import UserError
from harness.planning.items import PlannedItem
from repros.trainer.grid_axes import AXIS_ORDER, combination_id

#: The rank-side module that runs a grid combination (as written, or through the guards).
GRID_MODULE = "repros.trainer.scenario_item"
#: A combination as users write it, and the same run again through the fixed trainer's guards.
AS_WRITTEN = "as-written"
GUARDED = "guarded"


def restrict(grid: Grid, only: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """The axes with ``--only AXIS=V1,V2`` applied."""
    axes = dict(grid.axes)
    for text in only:
        axis, sep, values = text.partition("=")
        if not sep or not values:
            raise UserError("--only", text, "is not AXIS=V1,V2", "write it like --only engine=deepspeed-zero3,fsdp2")
        if axis not in axes:
            raise UserError("--only", text, f"the grid has no axis {axis!r}", f"use one of: {', '.join(axes)}")
        wanted = tuple(v.strip() for v in values.split(",") if v.strip())
        unknown = [v for v in wanted if v not in axes[axis]]
        if unknown:
            raise UserError(
                "--only", text, f"unknown value {unknown[0]!r} of {axis}", f"use one of: {', '.join(axes[axis])}"
            )
        axes[axis] = wanted
    return axes


def combinations(grid: Grid, coverage: str, axes: Mapping[str, tuple[str, ...]]) -> list[Combination]:
    """The included combinations (within ``axes``), then the rest of the coverage, none excluded."""
    names = [a for a in AXIS_ORDER if a in axes]

    def allowed(combination: Mapping[str, str]) -> bool:
        return all(combination[a] in axes[a] for a in names) and grid.excluded(combination) is None

    chosen: list[Combination] = [dict(c) for c in grid.include if allowed(c)]
    if coverage == "product":
        rest = (dict(zip(names, values, strict=True)) for values in itertools.product(*(axes[a] for a in names)))
        chosen += [c for c in rest if allowed(c) and c not in chosen]
        return chosen
    from covertable import make

    constraints = [
        {
            "operator": "not",
            "condition": {
                "operator": "and",
                "conditions": [
                    {"operator": "in", "left": axis, "values": list(values)} for axis, values in e.match.items()
                ],
            },
        }
        for e in grid.exclude
    ]
    rows = make(
        {a: list(axes[a]) for a in names}, constraints=constraints or None, presets=[dict(c) for c in chosen] or None
    )
    for row in rows:
        combination = {a: row[a] for a in names}
        if allowed(combination) and combination not in chosen:
            chosen.append(combination)
    return chosen


def planned(cells: Sequence[Cell], combos: Sequence[Combination]) -> list[PlannedItem]:
    return [
        PlannedItem(cell, combination_id(c), GRID_MODULE, AS_WRITTEN, cell.world_size, scenario=dict(c))
        for cell in cells
        for c in combos
    ]
