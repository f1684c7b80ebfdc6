"""What a run will do, item by item: a planned item (cell x repro x mode, or a grid combination, a costs
variant, a crosscheck strategy) and the plan that holds them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from harness.config.matrix import Cell
from harness.config.repros import BrokenRepro
from harness.core.json import JsonValue
from harness.records.item import ItemId
from harness.records.run_meta import ExcludedItem, ShardMeta


@dataclass(frozen=True)
class PlannedItem:
    cell: Cell
    repro_id: str
    module: str
    mode: str
    world_size: int
    #: ``costs``: the workaround variant the item runs (its ``mode`` is the variant's name).
    variant: str | None = None
    #: ``grid``: the combination the item runs, axis -> value.
    scenario: Mapping[str, str] | None = field(default=None, hash=False, compare=False)
    #: The mode the ranks run in, where it differs from ``mode`` (the record's label): a
    #: variant of ``costs`` is labelled by its name and runs in ``bug`` mode.
    rank_mode: str | None = None
    #: Explored: what it observes is a finding, reported per cell (``RunOptions.explore``).
    explore: bool = False
    #: ``crosscheck``: the strategy the item holds against one process (its ``mode`` is the same name), and
    #: what the ranks are told of the comparison (``seed``, ``steps``, a deliberate ``break``).
    strategy: str | None = None
    crosscheck: Mapping[str, JsonValue] | None = field(default=None, hash=False, compare=False)

    @property
    def runs_as_written(self) -> bool:
        """A scenario as users write it (a variant, a grid combination): classified against every
        documented signature and the training rule, with no expectation of its own."""
        return self.variant is not None or self.scenario is not None

    @property
    def judged_as(self) -> str:
        """What the classifier holds the item as (``harness/execution/classify.py``): a crosscheck strategy,
        a scenario as users write it, or a repro in its mode (``bug``, ``fixed``)."""
        if self.strategy is not None:
            return "crosscheck"
        return "scenario" if self.runs_as_written else self.mode

    @property
    def id(self) -> ItemId:
        return ItemId(self.cell.name, self.repro_id, self.mode)

    def launch_params(self) -> dict[str, JsonValue]:
        """What the ranks are told (``ctx.params``): the cell's model size, the variant or combination."""
        params: dict[str, JsonValue] = {"model": self.cell.model, "family": self.cell.family}
        if self.variant is not None:
            params["variant"] = self.variant
        if self.scenario is not None:
            params["scenario"] = dict(self.scenario)
        if self.strategy is not None:
            params["strategy"] = self.strategy
            params.update({k: v for k, v in (self.crosscheck or {}).items() if v is not None})
        return params


@dataclass
class Plan:
    items: list[PlannedItem] = field(default_factory=list)
    excluded: list[ExcludedItem] = field(default_factory=list)
    #: Repro files that could not be loaded, with each cell they would have run in.
    broken: list[tuple[Cell, BrokenRepro]] = field(default_factory=list)
    #: With ``--shard``: the whole plan and this shard's part of it (for ``run.json``).
    shard: ShardMeta | None = None

    @property
    def size(self) -> int:
        return len(self.items) + len(self.broken)
