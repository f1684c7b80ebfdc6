"""``repro_cmd``: one command that reruns a single item alone, as it ran.

It names everything that decides what the item is: the matrix (absolute), the cell, the repro,
the mode, the pins, the model size, the environment cache where one was given, and every
directory a user's repro came from (absolute): those given with ``--repros-dir``, and the
repro's own directory, wherever it was found (``$FT_REGRESS_REPROS``, the matrix's
``repros_dirs``), so the command works from any directory, in a shell without that variable.
It starts with the program the user ran (``ft-regress``, or ``python -m harness``).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

from harness.config.matrix import Cell
from harness.core.invocation import program
from harness.planning.items import PlannedItem, RunOptions
from repros.runtime.kinds import is_file_ref


def repro_dirs_for(repros_dirs: Sequence[Path], module: str | None) -> list[Path]:
    """The ``--repros-dir`` directories a rerun needs: those given, then the repro file's own."""
    dirs = [Path(d).resolve() for d in repros_dirs]
    if module and is_file_ref(module):
        own = Path(module).resolve().parent
        if own not in dirs:
            dirs.append(own)
    return list(dict.fromkeys(dirs))


def run_command(
    matrix: Path,
    cell: Cell,
    repro: str,
    mode: str,
    pins: tuple[tuple[str, str], ...],
    cache_dir: Path | None,
    repros_dirs: Sequence[Path] = (),
    model: str | None = None,
    module: str | None = None,
    world_size: int | None = None,
) -> str:
    args = [*program(), "run", "--matrix", str(Path(matrix).resolve())]
    args += ["--cells", cell.origin or cell.family_of or cell.name, "--repros", repro, "--modes", mode]
    if cell.family_of is not None:
        args += ["--family", cell.family]
    for name, spec in pins:
        args += ["--pin", f"{name}{spec}"]
    for directory in repro_dirs_for(repros_dirs, module):
        args += ["--repros-dir", str(directory)]
    if cache_dir is not None:
        args += ["--cache-dir", str(cache_dir)]
    if model:
        args += ["--model", model]
    if world_size:
        args += ["--world-size", str(world_size)]
    return shlex.join(args)


def repro_command(opts: RunOptions, item: PlannedItem) -> str:
    cache = opts.cache_dir if opts.cache_dir_given else None
    matrix = str(opts.matrix.path)
    dirs = repro_dirs_for(opts.repros_dirs, item.module)
    scenario = item.scenario
    if scenario is not None:
        # A grid combination: the grid, restricted to it, in its cell.
        args = [*program(), "grid", "--matrix", matrix, "--cells", item.cell.family_of or item.cell.name]
        if item.cell.family_of is not None:
            args += ["--family", item.cell.family]
        for axis, value in scenario.items():
            args += ["--only", f"{axis}={value}"]
        if opts.model:
            args += ["--model", opts.model]
        return shlex.join(args + (["--cache-dir", str(cache)] if cache else []))
    variant = item.variant
    if variant:
        args = [*program(), "costs", "--matrix", matrix, "--cells", item.cell.name]
        args += ["--repros", item.repro_id, "--variants", str(variant), "--model", item.cell.model]
        for directory in dirs:
            args += ["--repros-dir", str(directory)]
        return shlex.join(args + (["--cache-dir", str(cache)] if cache else []))
    return run_command(
        opts.matrix.path,
        item.cell,
        item.repro_id,
        item.mode,
        opts.pins,
        cache,
        opts.repros_dirs,
        opts.model,
        module=item.module,
        world_size=opts.world_size,
    )


def selection_command(opts: RunOptions, cells: Sequence[str], repros: Sequence[str], *more: str) -> str:
    """One command that runs these repros in these cells, as this run did (``established_by``)."""
    args = [*program(), "run", *more, "--matrix", str(opts.matrix.path), "--cells", ",".join(cells)]
    args += ["--repros", ",".join(repros)]
    for name, spec in opts.pins:
        args += ["--pin", f"{name}{spec}"]
    modules = [opts.discovery.repros[r].module for r in repros if r in opts.discovery.repros]
    dirs: list[Path] = [Path(d).resolve() for d in opts.repros_dirs]
    for module in modules:
        dirs = repro_dirs_for(dirs, module)
    for directory in dirs:
        args += ["--repros-dir", str(directory)]
    if opts.model:
        args += ["--model", opts.model]
    if opts.world_size:
        args += ["--world-size", str(opts.world_size)]
    if opts.families:
        args += ["--family", ",".join(opts.families)]
    return shlex.join(args)
