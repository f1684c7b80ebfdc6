"""Executors, by name: where items run (see ``base.py`` for the interface).

A new executor is one module with a class that has the ``ExecutorKind`` and ``Executor`` members,
plus its line in ``EXECUTORS``, or an installed package's entry point in the
``ft_regress.executors`` group. An executor's module is imported only when it is chosen, and a
cluster executor imports its engine (``ray``, ``submitit``) only when it is made.
"""

from __future__ import annotations

from harness.core.errors import UserError
from harness.core.names import one_of
from harness.pipeline.executors.base import (
    Attempted,
    Executor,
    ExecutorContext,
    ExecutorKind,
    ItemJob,
    ItemLost,
)
from harness.planning.run_options import ExecutorChoice
from repros.runtime.registry import Registry, lazy

EXECUTORS: Registry[ExecutorKind] = Registry(
    "executor",
    {
        "local": lazy("harness.pipeline.executors.local:LocalExecutor"),
        "ray": lazy("harness.pipeline.executors.ray:RayExecutor"),
        "slurm": lazy("harness.pipeline.executors.slurm:SlurmExecutor"),
    },
    group="ft_regress.executors",
)


def make_executor(context: ExecutorContext) -> Executor:
    return EXECUTORS[context.choice.name](context)


def check_choice(choice: ExecutorChoice) -> None:
    """Before a run starts: the executor is registered, the package it needs is installed, an option
    of one executor is not given to another, and what the executor checks of its options holds
    (an address nothing answers at, a cluster that is not there): ``UserError``, one line."""
    name = choice.name
    if name not in EXECUTORS:
        raise UserError("--executor", name, "no such executor", one_of(name, EXECUTORS))
    kind = EXECUTORS[name]
    if kind.needs is not None:
        package, extra = kind.needs
        try:
            __import__(package)
        except ImportError:
            raise UserError(
                "--executor",
                name,
                f"needs the '{package}' package, which is not installed",
                f"pip install 'ft-regress[{extra}]' (or: pip install {package})",
            ) from None
    if choice.ray_address and name != "ray":
        raise UserError("--ray-address", choice.ray_address, "is for --executor ray", "add --executor ray")
    if choice.slurm_folder and name != "slurm":
        raise UserError("--slurm-folder", str(choice.slurm_folder), "is for --executor slurm", "add --executor slurm")
    if choice.slurm_parameters and name != "slurm":
        given = ",".join(f"{k}={v}" for k, v in choice.slurm_parameters)
        raise UserError("--slurm-param", given, "is for --executor slurm", "add --executor slurm")
    kind.check(choice)


__all__ = [
    "EXECUTORS",
    "Attempted",
    "Executor",
    "ExecutorContext",
    "ExecutorKind",
    "ItemJob",
    "ItemLost",
    "check_choice",
    "make_executor",
]
