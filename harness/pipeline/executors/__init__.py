"""Executors, by name: where items run (see ``base.py`` for the interface).

A new executor is one module with a class that has the ``ExecutorKind`` and ``Executor`` members,
plus its line in ``EXECUTORS``, or an installed package's entry point in the
``ft_regress.executors`` group. It declares the options it takes (``options``), as a pytest plugin
declares its own: every verb that runs items, the pytest plugin and ``--help`` offer them
(``declared_options``), and their values reach it, checked here, in ``choice.executor_options``.
An executor's module is imported when the command line is built, to read its options; a cluster
executor imports its engine (``ray``, ``submitit``) only when it is made.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.core.errors import UserError
from harness.core.names import one_of
from harness.core.option import Option
from harness.pipeline.executors.base import (
    Attempted,
    Executor,
    ExecutorContext,
    ExecutorKind,
    ItemJob,
    ItemLost,
)
from harness.planning.run_options import ExecutorChoice
from repros.runtime.registry import Registry, RegistryClash, lazy

EXECUTORS: Registry[ExecutorKind] = Registry(
    "executor",
    {
        "local": lazy("harness.pipeline.executors.local:LocalExecutor"),
        "ray": lazy("harness.pipeline.executors.ray:RayExecutor"),
        "slurm": lazy("harness.pipeline.executors.slurm:SlurmExecutor"),
    },
    group="ft_regress.executors",
)


@dataclass(frozen=True)
class Declared:
    """An option an executor declares, and which executor."""

    executor: str
    option: Option


def declared_options() -> dict[str, Declared]:
    """Every registered executor's options, by destination, in the registry's order. An executor that
    does not load declares nothing here (choosing it says why); two executors declaring one
    destination or flag is refused in one line naming both (``RegistryClash``), never one shadowing
    the other."""
    found: dict[str, Declared] = {}
    owners: dict[str, str] = {}  # a destination or a flag: the executor that declares it
    for name in EXECUTORS.names():
        try:
            kind = EXECUTORS[name]
        except Exception:  # noqa: BLE001 - a broken package's executor: ``--executor`` NAME says why
            continue
        for option in getattr(kind, "options", ()):
            for key in (option.dest, *option.flags):
                first = owners.setdefault(key, name)
                if first != name:
                    raise RegistryClash("executor option", EXECUTORS.group or "", key, first, name)
            found[option.dest] = Declared(name, option)
    return found


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
    declared = declared_options()
    for dest, value in choice.executor_options.items():
        owner = declared.get(dest)
        given = ",".join(map(str, value)) if isinstance(value, list) else str(value)
        if owner is None:
            raise UserError(
                "options.executor_options",
                dest,
                f"is no option of any installed executor (given: {given})",
                "leave it out, or install the package whose executor declares it",
            )
        if owner.executor != name:
            flag = owner.option.flags[0]
            raise UserError(flag, given, f"is for --executor {owner.executor}", f"add --executor {owner.executor}")
    kind.check(choice)


__all__ = [
    "EXECUTORS",
    "Attempted",
    "Executor",
    "ExecutorContext",
    "ExecutorKind",
    "ItemJob",
    "ItemLost",
    "Declared",
    "check_choice",
    "declared_options",
    "make_executor",
]
