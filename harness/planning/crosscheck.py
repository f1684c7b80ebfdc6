"""``crosscheck``'s items: the strategies a lane holds against one process (every pair of axis values in some
strategy, every combination, or the names and patterns the matrix or ``--strategies`` gives), each planned in
every selected cell whose stack offers it (a cell without DeepSpeed offers no ZeRO stage, one without
bitsandbytes no 8-bit optimizer: those are excluded, saying so)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

from harness.config.crosscheck import CrosscheckConfig
from harness.config.matrix import Cell
from harness.config.repros import Repro
from harness.core.errors import UserError
from harness.core.json import JsonValue
from harness.planning.planned import PlannedItem
from harness.planning.run_options import RunOptions
from harness.records.run_meta import ExcludedItem
from repros.trainer.crosscheck import item as crosscheck_item
from repros.trainer.crosscheck.strategy import AXES, Strategy, UnknownStrategy, from_axes, matching, parse, valid

#: The rank-side module every crosscheck item runs, and the repro name its records carry.
CROSSCHECK_MODULE = "repros.trainer.crosscheck.item"
CROSSCHECK = "crosscheck"
#: What every crosscheck item runs.
CROSSCHECK_REPRO = Repro(spec=crosscheck_item.SPEC, module=CROSSCHECK_MODULE)


def space(axes: Mapping[str, Sequence[str]]) -> list[Strategy]:
    """Every strategy of the axes' values (those that exist: one process has no engine to accumulate)."""
    names = list(AXES)
    found = []
    for values in itertools.product(*(axes.get(a, AXES[a][:1]) for a in names)):
        combination = dict(zip(names, values, strict=True))
        if valid(combination):
            found.append(from_axes(combination))
    return found


def pairwise(axes: Mapping[str, Sequence[str]]) -> list[Strategy]:
    """Strategies in which every pair of two axes' values occurs at least once (covertable's greedy cover,
    deterministic), none that does not exist."""
    from covertable import make

    names = [a for a in AXES if len(axes.get(a, AXES[a][:1])) > 0]
    constraints = [
        {
            "operator": "not",
            "condition": {
                "operator": "and",
                "conditions": [
                    {"operator": "in", "left": "engine", "values": ["single"]},
                    {"operator": "in", "left": "accumulation", "values": ["engine"]},
                ],
            },
        }
    ]
    rows = make({a: list(axes.get(a, AXES[a][:1])) for a in names}, constraints=constraints)
    chosen: list[Strategy] = []
    for row in rows:
        combination = {a: row[a] for a in names}
        if valid(combination):
            strategy = from_axes(combination)
            if strategy not in chosen:
                chosen.append(strategy)
    return chosen


def select(config: CrosscheckConfig, lane: str | None, patterns: Sequence[str] = ()) -> list[Strategy]:
    """The strategies to run: ``--strategies`` (names or patterns, matched against every strategy of every
    axis value), else the lane's selection in the matrix (``pairwise`` by default)."""
    if patterns:
        return _named(patterns, space(AXES), "--strategies", " ".join(patterns))
    chosen = config.selection(lane)
    if chosen == "pairwise":
        return pairwise(config.axes)
    if chosen == "product":
        return space(config.axes)
    return _named(tuple(chosen), space(AXES), "crosscheck.lanes", str(lane))


def _named(patterns: Sequence[str], candidates: list[Strategy], field: str, value: str) -> list[Strategy]:
    found: list[Strategy] = []
    for pattern in patterns:
        if not any(ch in pattern for ch in "*?["):
            try:
                strategy = parse(pattern)
            except UnknownStrategy as exc:
                raise UserError(field, value, str(exc), "write a strategy as `crosscheck --list` prints it") from None
            if strategy not in found:
                found.append(strategy)
            continue
        matched = matching([pattern], candidates)
        if not matched:
            raise UserError(field, value, f"{pattern!r} matches no strategy", "see `crosscheck --list --lane product`")
        found += [s for s in matched if s not in found]
    return found


def not_offered(cell: Cell, strategy: Strategy) -> str | None:
    """Why ``cell``'s stack cannot train ``strategy``, or None (a package it needs is left out of the cell)."""
    for package, why in strategy.packages().items():
        if cell.packages.get(package) is None and cell.installs_packages:
            return f"the cell has no {package} ({why} needs it)"
    return None


def planned(
    cells: Sequence[Cell], strategies: Sequence[Strategy], params: Mapping[str, JsonValue]
) -> tuple[list[PlannedItem], list[ExcludedItem]]:
    """Each strategy in each cell that offers it; ``params``: what every item's ranks are told besides (``seed``,
    ``steps``, ``break``)."""
    items: list[PlannedItem] = []
    excluded: list[ExcludedItem] = []
    for cell in cells:
        for strategy in strategies:
            why = not_offered(cell, strategy)
            if why is not None:
                excluded.append(ExcludedItem(cell=cell.name, repro=CROSSCHECK, mode=strategy.name, reason=why))
                continue
            items.append(
                PlannedItem(
                    cell,
                    CROSSCHECK,
                    CROSSCHECK_MODULE,
                    strategy.name,
                    strategy.world_size or cell.world_size,
                    strategy=strategy.name,
                    crosscheck=dict(params),
                )
            )
    return items, excluded


def run_lane(opts: RunOptions) -> str | None:
    """The lane a run's selection runs: ``--lane``, else the matrix's default where no cells were named."""
    return opts.selection.lane or (None if opts.selection.cells else opts.matrix.default_lane)


def crosscheck_items(opts: RunOptions, cells: Sequence[Cell]) -> tuple[list[PlannedItem], list[ExcludedItem]]:
    """The crosscheck items ``run`` holds beside the repros' items: the lane's strategies where the matrix's
    ``crosscheck.lanes`` names the lane (or ``--repros`` names ``crosscheck``), unless ``--repros`` (or the
    matrix's ``repros:``) leaves them out."""
    chosen = opts.selection.repros or opts.matrix.repros
    lane = run_lane(opts)
    if chosen and CROSSCHECK not in chosen:
        return [], []
    if not chosen and (lane is None or lane not in opts.matrix.crosscheck.lanes):
        return [], []
    config = opts.matrix.crosscheck
    strategies = select(config, lane)
    mine = [c for c in cells if config.runs_in(lane, c.origin or c.family_of or c.name)]
    return planned(mine, strategies, {"seed": 0, "steps": config.steps})
