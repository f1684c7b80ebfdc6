"""What a run will do: its options, and the items they select (cell x repro x mode).

Every user error in a selection (an unknown repro, cell, lane or mode) is found here,
before anything runs. Nothing depends on a cell's name.
"""

from __future__ import annotations

from pathlib import Path

from packaging.version import InvalidVersion, Version

from harness.config.matrix import Cell
from harness.config.model import Matrix
from harness.config.repros import BrokenRepro, Repro
from harness.core.errors import UserError
from harness.core.names import one_of, unknown_repro_fix
from harness.planning.crosscheck import CROSSCHECK, CROSSCHECK_REPRO, crosscheck_items
from harness.planning.planned import Plan, PlannedItem
from harness.planning.run_options import RunOptions
from harness.planning.shards import Shard, assign, durations_from, shard_meta
from harness.records.item import ItemId
from harness.records.run_meta import ExcludedItem
from repros.runtime.families import FAMILIES
from repros.runtime.spec import MODES, ReproSpec


def repro_of(opts: RunOptions, item: PlannedItem) -> Repro:
    """What ``item``'s ranks run: its discovered repro, or the crosscheck item for a strategy."""
    return CROSSCHECK_REPRO if item.strategy is not None else opts.discovery.repros[item.repro_id]


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


def package_exclusion(cell: Cell, spec: ReproSpec) -> str | None:
    """Why ``spec`` cannot run in ``cell`` for want of a package, or None: a cell that pins its packages
    and runs every repro, without a package the failure depends on (``ReproSpec.depends_on``: its
    mechanism runs through it). A cell naming its repros runs what it names (an INFRA item that says what
    is missing is what it is there to show), and a floating cell resolves whatever its newest releases
    bring: neither is excluded here."""
    if cell.repros is not None or not cell.installs_packages or cell.floating:
        return None
    missing = [p for p in spec.depends_on if p not in cell.packages]
    if not missing:
        return None
    return f"no {', '.join(missing)} in this cell: {spec.id} depends on {'it' if len(missing) == 1 else 'them'}"


def item_exclusion(matrix: Matrix, cell: Cell, spec: ReproSpec, mode: str) -> str | None:
    """Why ``spec``'s ``mode`` item is not planned in ``cell``, or None: the matrix's own exclusion (a cell
    made for another family keeps its matrix cell's), else what planning derives (a package it lacks, a
    family or world size the failure cannot occur in)."""
    excluded = matrix.exclusion(cell.family_of or cell.name, spec.id, mode)
    if excluded is not None:
        return excluded.reason
    return (
        package_exclusion(cell, spec)
        or family_exclusion(cell, spec)
        or spec.world_size_exclusion(spec.world_size or cell.world_size)
    )


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
        if wanted not in known and wanted not in opts.discovery.broken and wanted != CROSSCHECK:
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
                world_size = repro.spec.world_size or cell.world_size
                reason = item_exclusion(opts.matrix, cell, repro.spec, mode)
                if reason is not None:
                    plan.excluded.append(ExcludedItem(cell=cell.name, repro=repro_id, mode=mode, reason=reason))
                    continue
                explore = opts.explore or not any(e.mode == mode for e in repro.spec.expectations)
                plan.items.append(PlannedItem(cell, repro_id, repro.module, mode, world_size, explore=explore))
    items, excluded = crosscheck_items(opts, selected_cells(opts))
    plan.items += items
    plan.excluded += excluded
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
