"""What a run will do: its options, and the items they select (cell x repro x mode).

Every user error in a selection (an unknown repro, cell, lane or mode) is found here,
before anything runs. Nothing depends on a cell's name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from harness.config.matrix import Cell
from harness.config.repros import BrokenRepro
from harness.core.errors import UserError
from harness.core.json import JsonValue
from harness.core.names import one_of, unknown_repro_fix
from harness.planning.run_options import RunOptions
from harness.planning.shards import Shard, assign, durations_from, shard_meta
from harness.records.item import ItemId
from harness.records.run_meta import ExcludedItem, ShardMeta
from repros.runtime.families import FAMILIES
from repros.runtime.spec import MODES, ReproSpec


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


def family_exclusion(cell: Cell, spec: ReproSpec) -> str | None:
    """Why ``spec`` cannot run in ``cell``'s family, or None: a transformers pinned before the family
    existed, or a failure the family cannot have."""
    family = FAMILIES[cell.family]
    pinned = cell.packages.get("transformers", "")
    if pinned.startswith("==") and not pinned.endswith("*"):
        try:
            if Version(pinned[2:]) < Version(family.min_transformers):
                return f"transformers {pinned[2:]} predates {family.name} (first in {family.min_transformers})"
        except InvalidVersion:
            pass
    why = spec.impossible_in.get(cell.family)
    return f"cannot occur in {cell.family}: {why}" if why else None


def broken_label(cell: Cell, broken: BrokenRepro) -> str:
    return ItemId(cell.name, broken.id, "bug").label()


def matrix_cells(opts: RunOptions) -> list[Cell]:
    """The matrix's cells the selection names (``--cells``, ``--lane``, else the default lane), as declared."""
    matrix, chosen = opts.matrix, opts.selection
    if chosen.cells:
        for name in chosen.cells:
            if name not in matrix.cells:
                raise UserError(matrix.path, "cells", f"no cell named {name!r}", one_of(name, matrix.cells))
        cells = [matrix.cells[n] for n in chosen.cells]
        if chosen.lane:
            matrix.cells_in_lane(chosen.lane)  # an unknown lane is refused, not taken to hold no cell
            cells = [c for c in cells if chosen.lane in c.lanes]
        return cells
    lane = chosen.lane or matrix.default_lane
    return matrix.cells_in_lane(lane) if lane else list(matrix.cells.values())


def selected_cells(opts: RunOptions) -> list[Cell]:
    """The selected cells, each as the run's stack choice makes it (``StackChoice.cells``)."""
    declared = matrix_cells(opts)
    cells = opts.stack.cells(declared)
    if opts.stack.pins and not cells:
        held = ", ".join(sorted({f"{c.name} ({c.provider})" for c in unpinnable_cells(opts)})) or "none"
        raise UserError(
            "--pin",
            opts.stack.pins_text,
            f"leaves no cell to run: no selected cell installs packages (selected: {held}); a cell of the "
            "running interpreter takes it as it is",
            "select cells whose packages uv installs (provider: uv), or drop --pin",
        )
    return cells


def unpinnable_cells(opts: RunOptions) -> list[Cell]:
    """The selected cells ``--pin`` leaves out: those whose provider installs no packages (the
    running interpreter, as it is). Their items are excluded, saying so."""
    if not opts.stack.pins:
        return []
    return [c for c in matrix_cells(opts) if not c.installs_packages]


def default_repros(opts: RunOptions) -> tuple[str, ...]:
    """Only what was asked for: ``--repros``, else the matrix's ``repros:``, else the repros of the
    directories named (``--repros-dir``, the matrix's ``repros_dirs``), else () (every repro)."""
    chosen = opts.selection
    if chosen.repros or opts.matrix.repros:
        return tuple(chosen.repros or opts.matrix.repros or ())
    named = {Path(d).resolve() for d in (*chosen.repros_dirs, *opts.matrix.repros_dirs)}
    if not named:
        return ()

    def from_named(module: str) -> bool:
        return not module.startswith("repros.") and Path(module).resolve().parent in named

    mine = [r.id for r in opts.discovery.repros.values() if from_named(r.module)]
    mine += [stem for stem, b in opts.discovery.broken.items() if from_named(b.module)]
    return tuple(sorted(mine))


def plan_items(opts: RunOptions) -> Plan:
    known = opts.discovery.repros
    chosen = opts.selection
    for wanted in chosen.repros:
        if wanted not in known and wanted not in opts.discovery.broken:
            fix = unknown_repro_fix(wanted, [*known, *opts.discovery.broken])
            raise UserError("--repros", wanted, "unknown repro", fix)
    wanted_repros = default_repros(opts)
    for mode in chosen.modes:
        if mode not in MODES:
            raise UserError("--modes", mode, "unknown mode", f"use one of: {', '.join(MODES)}")
    plan = Plan()
    # The order asked for with --repros (or the matrix's repros), else by id.
    order = [r for r in wanted_repros if r in known] if wanted_repros else sorted(known)
    pins = opts.stack.pins_text
    for cell in unpinnable_cells(opts):
        for repro_id in order:
            if cell.repros is not None and repro_id not in cell.repros:
                continue
            for mode in (m for m in known[repro_id].spec.modes if m in chosen.modes):
                why = (
                    f"--pin {pins} cannot change its packages: provider {cell.provider} takes the interpreter as it is"
                )
                plan.excluded.append(ExcludedItem(cell=cell.name, repro=repro_id, mode=mode, reason=why))
    for cell in selected_cells(opts):
        for stem, broken in sorted(opts.discovery.broken.items()):
            if not wanted_repros or stem in wanted_repros:
                plan.broken.append((cell, broken))
        for repro_id in order:
            repro = known[repro_id]
            if cell.repros is not None and repro_id not in cell.repros:
                continue
            for mode in repro.spec.modes:
                if mode not in chosen.modes:
                    continue
                exclusion = opts.matrix.exclusion(cell.family_of or cell.name, repro_id, mode)
                world_size = repro.spec.world_size or cell.world_size
                reason = (
                    exclusion.reason
                    if exclusion is not None
                    else family_exclusion(cell, repro.spec) or repro.spec.world_size_exclusion(world_size)
                )
                if reason is not None:
                    plan.excluded.append(ExcludedItem(cell=cell.name, repro=repro_id, mode=mode, reason=reason))
                    continue
                explore = opts.explore or not any(e.mode == mode for e in repro.spec.expectations)
                plan.items.append(PlannedItem(cell, repro_id, repro.module, mode, world_size, explore=explore))
    if chosen.shard is not None:
        _keep_shard(plan, opts, chosen.shard)
    return plan


def _keep_shard(plan: Plan, opts: RunOptions, shard: Shard) -> None:
    """Keep only ``shard``'s part of the whole plan (see ``harness.planning.shards``)."""
    labels = [i.id.label() for i in plan.items] + [broken_label(c, b) for c, b in plan.broken]
    durations = durations_from(opts.reports_dir)
    if opts.shard_items is not None:
        mine = set(opts.shard_items)
    else:
        mine = set(assign(labels, durations, shard.count)[shard.index - 1])
    plan.items = [i for i in plan.items if i.id.label() in mine]
    plan.broken = [(c, b) for c, b in plan.broken if broken_label(c, b) in mine]
    plan.shard = shard_meta(shard, labels, [k for k in labels if k in mine], durations, opts.reports_dir)
