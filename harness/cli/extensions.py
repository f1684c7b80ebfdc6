"""Every kind of extension, one file plus one registration each: where the file goes, where it is
registered, the entry-point group an installed package declares it under (where it may), its
interface, and what is registered now (read from the live registry). The docs' reference page is
generated from this table; tests register a throwaway of several kinds, and install a package that
adds a repro and an executor through entry points.

Every registry is one type (``repros/runtime/registry.py``): the built-ins, the installed packages'
entry points of its group, and what code registers at run time, read whenever it is used."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from harness.cli.commands import COMMANDS
from harness.cli.commands.base import Command
from harness.config.repros import REPRO_SOURCES
from harness.environments import PROVIDERS
from harness.environments.base import EnvironmentProvider
from harness.execution.launchers import LAUNCHERS
from harness.execution.launchers.base import Launcher
from harness.pipeline.executors import EXECUTORS
from harness.pipeline.executors.base import Executor
from harness.reports.finalize import WRITERS
from harness.reports.finished import FinishedRun
from repros.runtime import families
from repros.runtime.families import FAMILIES
from repros.runtime.kinds import KINDS
from repros.runtime.kinds.base import ReproKind
from repros.runtime.measures import METERS
from repros.runtime.measures.base import Meter
from repros.runtime.registry import Registry
from repros.trainer import grid_axes
from repros.trainer.grid_axes import AXES
from repros.trainer.guards import GUARDS, GuardRule

T = TypeVar("T")


@dataclass(frozen=True)
class ExtensionPoint:
    #: What one entry is, in words (the registry's ``kind``).
    kind: str
    #: The entry-point group installed packages declare entries under; None: registered in code only.
    group: str | None
    #: The names registered now (read from the live registry).
    registered: Callable[[], list[str]]
    #: The interface a new one implements (a class or a callable's shape), dotted.
    interface: str
    #: Where its file goes.
    directory: str
    #: ``module:NAME`` of the registry it is added to.
    where: str
    documented_by: object

    def describe(self) -> str:
        return inspect.getdoc(self.documented_by) or ""


def _writer_interface(run: FinishedRun) -> None:
    """A report writer: ``write(run: FinishedRun) -> Path`` reads the run's records and ``run.json``
    and writes one file into the run directory (``harness/reports/junit.py`` is one)."""


def _repro_source(entry: Path) -> None:
    """A repro source: an installed package's module, named under ``ft_regress.repros``. A package's
    directory holds repro files (each a ``SPEC`` and ``run(ctx)``, or a script and its declaration),
    read like a ``--repros-dir``'s (in a child process, never imported by the orchestrator); a
    module is one repro. ``ft-regress run --repros ID`` runs them like any other."""


def _point(registry: Registry[T], interface: str, directory: str, where: str, documented_by: object) -> ExtensionPoint:
    return ExtensionPoint(registry.kind, registry.group, registry.names, interface, directory, where, documented_by)


EXTENSION_POINTS: tuple[ExtensionPoint, ...] = (
    _point(
        REPRO_SOURCES,
        "a module of repro files (ft_regress.repros)",
        "your package",
        "harness/config/repros.py:REPRO_SOURCES",
        _repro_source,
    ),
    _point(
        LAUNCHERS,
        "harness.execution.launchers.base.Launcher",
        "harness/execution/launchers/",
        "harness/execution/launchers/__init__.py:LAUNCHERS",
        Launcher,
    ),
    _point(
        EXECUTORS,
        "harness.pipeline.executors.base.Executor",
        "harness/pipeline/executors/",
        "harness/pipeline/executors/__init__.py:EXECUTORS",
        Executor,
    ),
    _point(
        PROVIDERS,
        "harness.environments.base.EnvironmentProvider",
        "harness/environments/",
        "harness/environments/__init__.py:PROVIDERS",
        EnvironmentProvider,
    ),
    _point(
        WRITERS,
        "write(run: FinishedRun) -> Path",
        "harness/reports/",
        "harness/reports/finalize.py:WRITERS",
        _writer_interface,
    ),
    _point(
        COMMANDS,
        "harness.cli.commands.base.Command",
        "harness/cli/commands/",
        "harness/cli/commands/__init__.py:COMMANDS",
        Command,
    ),
    _point(
        METERS,
        "repros.runtime.measures.base.Meter",
        "repros/runtime/measures/",
        "repros/runtime/measures/__init__.py:METERS",
        Meter,
    ),
    _point(
        KINDS,
        "repros.runtime.kinds.base.ReproKind",
        "repros/runtime/kinds/",
        "repros/runtime/kinds/__init__.py:KINDS",
        ReproKind,
    ),
    _point(
        GUARDS,
        "repros.trainer.guards.GuardRule",
        "repros/catalog/<failure>.py (its GUARD; one line in GUARDS, in the order chosen)",
        "repros/trainer/guards.py:GUARDS",
        GuardRule,
    ),
    _point(AXES, "axis -> value -> Scenario fields", "(a row)", "repros/trainer/grid_axes.py:AXES", grid_axes),
    _point(FAMILIES, "repros.runtime.families.Family", "(a row)", "repros/runtime/families.py:FAMILIES", families),
)
