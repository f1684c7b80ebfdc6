"""``atlas check --prove``: build the stack as a cell, run the failures the atlas could not answer for, keep what
they saw.

The stack becomes a matrix of one cell (``stack``), written beside the atlas (``DIR/stacks/<digest>.yaml``, so
every record's rerun command names a file that exists): a uv cell pinning the packages that decide the
failures (the tracked ones and any a failure depends on, such as ``trl``), everything else resolved by uv as
the pins allow; for ``--here``, a passthrough cell (the running interpreter, as it is). The failures' ``bug``
mode runs through the same planning and session as ``run`` (its directory under ``DIR/runs``); then the atlas
is built again with that run among its sources, so the evidence stays.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import yaml
from rich.console import Console

from harness.config.model import DEFAULT_PYTHON, DEFAULT_WORLD_SIZE
from harness.environments.stacks import Stack
from harness.pipeline.session import RunSession
from harness.planning.items import RunOptions, plan_items
from repros.runtime.spec import TRACKED_PACKAGES, ReproSpec

#: The one cell of a stack's matrix.
CELL = "stack"
STACKS_DIR = "stacks"
RUNS_DIR = "runs"


def _python(stack: Stack) -> str:
    """The stack's Python as a cell names it (``3.11``), else the matrix default."""
    version = stack.version("python")
    return f"{version.major}.{version.minor}" if version is not None else DEFAULT_PYTHON


def stack_matrix(
    stack: Stack,
    failures: Sequence[ReproSpec],
    atlas_dir: Path,
    passthrough: bool,
    as_of: str | None = None,
    what: str = "the stack atlas check --prove was asked about",
) -> Path:
    """A matrix of one cell that is ``stack``, written under ``atlas_dir``; its path. ``as_of``: the day the
    packages the stack does not pin are resolved as of (nothing released after it is installed: the cell's
    ``exclude_newer``), a stack's own day. A build's local label (``2.9.0+cu129``, PyTorch's own index) is
    pinned as its release (``==2.9.0``): the registry's build of it is what installs here."""
    wanted = list(dict.fromkeys([*TRACKED_PACKAGES, *(p for f in failures for p in f.deciding_packages)]))
    packages = {name: f"=={_installable(stack.versions[name])}" for name in wanted if name in stack.versions}
    cell: dict[str, object] = {
        "description": f"{what} ({stack.source}): {stack.text(wanted)}",
        "lanes": ["prove"],
    }
    if passthrough:
        cell["provider"] = "passthrough"
    if as_of is not None:
        cell["exclude_newer"] = as_of
    matrix = {
        "version": 1,
        "default_lane": "prove",
        "lanes": {"prove": "a stack atlas check could not answer for, built to run what it does not know"},
        "defaults": {"world_size": DEFAULT_WORLD_SIZE, "python": _python(stack), "packages": packages},
        "cells": {CELL: cell},
    }
    text = f"# Written by ft-regress atlas: {what}, as one cell.\n" + yaml.safe_dump(matrix, sort_keys=False)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    path = atlas_dir / STACKS_DIR / f"{digest}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _installable(version: str) -> str:
    """A version as a cell pins it: a CUDA build's local label (``+cu129``) dropped, a CPU build's kept (a
    find-links folder holds such builds; ``==2.13.0`` would find them too)."""
    release, _, label = version.partition("+")
    return version if not label or label == "cpu" else release


def run_stack(opts: RunOptions, console: Console, argv: Sequence[str]) -> tuple[int, Path | None]:
    """Run the planned items as ``run`` does; the exit status and the run's directory."""
    session = RunSession(opts, console, argv, None, plan=plan_items(opts), kind="atlas-prove")
    status = session.execute()
    return status, session.path
