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
    return run_command(
        opts.matrix.path, item.cell, item.repro_id, item.mode, opts.pins, cache, opts.repros_dirs, opts.model
    )
