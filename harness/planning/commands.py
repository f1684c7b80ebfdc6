"""``repro_cmd``: one command that reruns a single item alone, as it ran.

It names everything that decides what the item is: the matrix (absolute), the cell, the repro,
the mode, every option that chose the cell's stack (``StackChoice.flags``: ``--pin``, ``--as-of``,
``--model``, ``--world-size``, the item's ``--family``; a floating cell run without ``--as-of`` gets
the time its specs were resolved as its ``--as-of``), the environment cache where one was given,
and every directory a user's repro came from (absolute): those given with ``--repros-dir``, and the
repro's own directory, wherever it was found (``$FT_REGRESS_REPROS``, the matrix's
``repros_dirs``), so the command works from any directory, in a shell without that variable.
It starts with the program the user ran (``ft-regress``, or ``python -m harness``).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from pathlib import Path

from harness.config.locate import DEFAULT_MATRIX_NAME
from harness.config.matrix import Cell
from harness.core.as_of import as_of_value
from harness.core.invocation import program
from harness.environments import Environment
from harness.planning.items import PlannedItem
from harness.planning.run_options import CacheChoice, RunOptions, StackChoice
from repros.runtime.kinds import is_file_ref


def repro_dirs_for(repros_dirs: Sequence[Path], module: str | None) -> list[Path]:
    """The ``--repros-dir`` directories a rerun needs: those given, then the repro file's own."""
    dirs = [Path(d).resolve() for d in repros_dirs]
    if module and is_file_ref(module):
        own = Path(module).resolve().parent
        if own not in dirs:
            dirs.append(own)
    return list(dict.fromkeys(dirs))


def _verb_in_cell(verb: str, matrix: str, cell: Cell) -> list[str]:
    """``VERB --matrix MATRIX --cells CELL``: the matrix cell a (pinned, family) cell came from."""
    return [*program(), verb, "--matrix", matrix, "--cells", cell.origin or cell.family_of or cell.name]


def run_command(
    matrix: Path,
    cell: Cell,
    repro: str,
    mode: str,
    stack: StackChoice,
    cache: CacheChoice,
    repros_dirs: Sequence[Path] = (),
    module: str | None = None,
) -> str:
    """``run`` of one item: its matrix cell, repro and mode, on the stack ``stack`` chose."""
    args = [*_verb_in_cell("run", str(Path(matrix).resolve()), cell), "--repros", repro, "--modes", mode]
    args += stack.for_cell(cell).flags()
    for directory in repro_dirs_for(repros_dirs, module):
        args += ["--repros-dir", str(directory)]
    return shlex.join(args + cache.flags())


def crosscheck_command(matrix: Path, item: PlannedItem, stack: StackChoice, cache: CacheChoice) -> str:
    """``crosscheck`` of one item: its strategy, in its matrix cell, on the stack ``stack`` chose, as it was asked
    (its steps, seed and deliberate fault)."""
    assert item.strategy is not None
    args = [*_verb_in_cell("crosscheck", str(Path(matrix).resolve()), item.cell), "--strategies", item.strategy]
    args += stack.for_cell(item.cell).flags()
    asked = item.crosscheck or {}
    for flag, key in (("--steps", "steps"), ("--seed", "seed"), ("--break", "break")):
        value = asked.get(key)
        if value is not None and (key == "steps" or value != 0):
            args += [flag, str(value)]
    return shlex.join(args + cache.flags())


def item_stack(opts: RunOptions, item: PlannedItem, env: Environment | None = None) -> StackChoice:
    """What chose ``item``'s stack, whole: where its cell floats and the run gave no ``--as-of``, the
    time its environment's floating specs were resolved stands in for "now", so that a rerun
    resolves what this run resolved, not what is newest the day it is rerun."""
    stack = opts.stack.for_cell(item.cell)
    resolved_at = env.resolution.get("resolved_at") if env is not None and env.resolution else None
    if stack.as_of is None and item.cell.floating and resolved_at:
        stack = stack.evolve(as_of=as_of_value(str(resolved_at)))
    return stack


def repro_command(opts: RunOptions, item: PlannedItem, env: Environment | None = None) -> str:
    """The one command that reruns ``item`` alone, as ``opts`` ran it (in ``env``, where it is known)."""
    matrix = str(opts.matrix.path)
    stack = item_stack(opts, item, env)
    dirs = repro_dirs_for(opts.selection.repros_dirs, item.module)
    if item.strategy is not None:
        return crosscheck_command(opts.matrix.path, item, stack, opts.cache)
    scenario = item.scenario
    if scenario is not None:
        # A grid combination: the grid, restricted to it, in its cell.
        args = [*_verb_in_cell("grid", matrix, item.cell), *stack.flags()]
        for axis, value in scenario.items():
            args += ["--only", f"{axis}={value}"]
        return shlex.join(args + opts.cache.flags())
    variant = item.variant
    if variant:
        args = [*_verb_in_cell("costs", matrix, item.cell), "--repros", item.repro_id, "--variants", str(variant)]
        args += stack.evolve(model=item.cell.model).flags()
        for directory in dirs:
            args += ["--repros-dir", str(directory)]
        return shlex.join(args + opts.cache.flags())
    return run_command(
        opts.matrix.path,
        item.cell,
        item.repro_id,
        item.mode,
        stack,
        opts.cache,
        opts.selection.repros_dirs,
        item.module,
    )


def selection_command(opts: RunOptions, cells: Sequence[str], repros: Sequence[str], cwd: Path | None = None) -> str:
    """The command that runs these repros in these cells as this run did, as the user would type it
    where they ran it (``cwd``): the program they ran, paths relative to that directory, the matrix
    only where it is not the one found there, a repro directory only where the matrix does not name
    it (``established_by``)."""
    here = (cwd or Path.cwd()).resolve()
    args = [*program(), "run"]
    if opts.matrix.path.resolve() != (here / DEFAULT_MATRIX_NAME).resolve():
        args += ["--matrix", os.path.relpath(opts.matrix.path, here)]
    args += ["--cells", ",".join(cells), "--repros", ",".join(repros)]
    args += opts.stack.flags()
    modules = [opts.discovery.repros[r].module for r in repros if r in opts.discovery.repros]
    dirs: list[Path] = [Path(d).resolve() for d in opts.selection.repros_dirs]
    for module in modules:
        dirs = repro_dirs_for(dirs, module)
    found_anyway = {Path(d).resolve() for d in opts.matrix.repros_dirs}
    for directory in dirs:
        if directory not in found_anyway:
            args += ["--repros-dir", os.path.relpath(directory, here)]
    return shlex.join(args)
