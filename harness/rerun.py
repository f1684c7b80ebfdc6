"""``repro_cmd``: one command that reruns a single item alone, as it ran."""

from __future__ import annotations

import shlex
from pathlib import Path

from harness.matrix import Cell
from harness.planning import PlannedItem, RunOptions


def run_command(
    matrix: Path,
    cell: Cell,
    repro: str,
    mode: str,
    pins: tuple[tuple[str, str], ...],
    cache_dir: Path | None,
    repros_dirs: tuple[Path, ...] = (),
    model: str | None = None,
) -> str:
    args = ["python", "-m", "harness", "run", "--matrix", str(matrix), "--cells", cell.origin or cell.name]
    args += ["--repros", repro, "--modes", mode]
    for name, spec in pins:
        args += ["--pin", f"{name}{spec}"]
    for directory in repros_dirs:
        args += ["--repros-dir", str(Path(directory).resolve())]
    if cache_dir is not None:
        args += ["--cache-dir", str(cache_dir)]
    if model:
        args += ["--model", model]
    return shlex.join(args)


def repro_command(opts: RunOptions, item: PlannedItem) -> str:
    cache = opts.cache_dir if opts.cache_dir_given else None
    scenario = item.params.get("scenario")
    if isinstance(scenario, dict):
        # A grid combination: the grid, restricted to it, in its cell.
        args = ["python", "-m", "harness", "grid", "--matrix", str(opts.matrix.path), "--cells", item.cell.name]
        for axis, value in scenario.items():
            args += ["--only", f"{axis}={value}"]
        if opts.model:
            args += ["--model", opts.model]
        return shlex.join(args + (["--cache-dir", str(cache)] if cache else []))
    variant = item.params.get("variant")
    if variant:
        args = ["python", "-m", "harness", "costs", "--matrix", str(opts.matrix.path), "--cells", item.cell.name]
        args += ["--repros", item.repro_id, "--variants", str(variant), "--model", item.cell.model]
        for directory in opts.repros_dirs:
            args += ["--repros-dir", str(Path(directory).resolve())]
        return shlex.join(args + (["--cache-dir", str(cache)] if cache else []))
    return run_command(
        opts.matrix.path, item.cell, item.repro_id, item.mode, opts.pins, cache, opts.repros_dirs, opts.model
    )
