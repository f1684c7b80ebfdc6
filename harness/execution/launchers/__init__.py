"""Launchers, by name: what starts an item's ranks (see ``base.py`` for the interface).

A new launcher (Slurm, Kubernetes...) is one module with a class that has the ``Launcher``
methods, plus its line in ``LAUNCHERS``, or an installed package's entry point in the
``ft_regress.launchers`` group (``repros/runtime/registry.py``).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from harness.execution.launchers.base import Launcher, LauncherContext, LaunchRequest
from harness.execution.launchers.result import LaunchResult
from harness.execution.launchers.supervision import groups_in_flight, kill_in_flight
from harness.execution.launchers.torchrun import TorchrunLauncher
from harness.execution.launchers.worker import WorkerLauncher
from repros.runtime.registry import Registry

LAUNCHERS: Registry[Callable[[LauncherContext], Launcher]] = Registry(
    "launcher", {"worker": WorkerLauncher, "torchrun": TorchrunLauncher}, group="ft_regress.launchers"
)
#: Chooses the default launcher where no option does (the stand-in test stack fakes torchrun only).
LAUNCHER_VARIABLE = "FT_REGRESS_LAUNCHER"


def default_launcher() -> str:
    """``$FT_REGRESS_LAUNCHER`` when it names a launcher, else the pre-imported worker."""
    chosen = os.environ.get(LAUNCHER_VARIABLE, "")
    return chosen if chosen in LAUNCHERS else "worker"


def make_launcher(name: str, context: LauncherContext) -> Launcher:
    return LAUNCHERS[name](context)


__all__ = [
    "LAUNCHERS",
    "LaunchRequest",
    "LaunchResult",
    "Launcher",
    "LauncherContext",
    "default_launcher",
    "groups_in_flight",
    "kill_in_flight",
    "make_launcher",
]
