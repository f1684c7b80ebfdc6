"""Executors, by name: where items run (see ``base.py`` for the interface).

A new executor is one module with a class that has the ``Executor`` methods, plus its line in
``EXECUTORS``. Cluster executors import their engine (``ray``, ``submitit``) only when chosen.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from harness.environments import Environments
from harness.pipeline.executors.base import Attempted, Executor, ExecutorContext, ItemJob, ItemLost
from harness.records.run_dir import RunDir


def _local(context: ExecutorContext, run_dir: RunDir, run_id: str, environments: Environments | None) -> Executor:
    from harness.pipeline.executors.local import LocalExecutor

    return LocalExecutor(context, run_dir, environments)


def _ray(context: ExecutorContext, run_dir: RunDir, run_id: str, environments: Environments | None) -> Executor:
    from harness.pipeline.executors.ray import RayExecutor

    return RayExecutor(context, run_dir, run_id)


def _slurm(context: ExecutorContext, run_dir: RunDir, run_id: str, environments: Environments | None) -> Executor:
    from harness.pipeline.executors.slurm import SlurmExecutor

    return SlurmExecutor(context, run_dir, run_id)


def _ray_options(options: Mapping[str, Any]) -> None:
    from harness.pipeline.executors.ray import check_options

    check_options(options)


def _slurm_options(options: Mapping[str, Any]) -> None:
    from harness.pipeline.executors.slurm import check_options

    check_options(options)


ExecutorFactory = Callable[[ExecutorContext, RunDir, str, Environments | None], Executor]

EXECUTORS: dict[str, ExecutorFactory] = {"local": _local, "ray": _ray, "slurm": _slurm}
#: The Python package each cluster executor needs, and the extra that installs it.
NEEDS = {"ray": ("ray", "ray"), "slurm": ("submitit", "slurm")}
#: What each executor checks of its options before a run starts (a cluster nothing answers at, a
#: cluster that is not there): ``UserError``, one line, where it cannot run as asked.
CHECKS: dict[str, Callable[[Mapping[str, Any]], None]] = {"ray": _ray_options, "slurm": _slurm_options}


def make_executor(
    name: str,
    context: ExecutorContext,
    run_dir: RunDir,
    run_id: str,
    environments: Environments | None,
) -> Executor:
    return EXECUTORS[name](context, run_dir, run_id, environments)


__all__ = [
    "CHECKS",
    "EXECUTORS",
    "NEEDS",
    "Attempted",
    "Executor",
    "ExecutorContext",
    "ItemJob",
    "ItemLost",
    "make_executor",
]
