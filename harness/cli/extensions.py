"""Every kind of extension, one file plus one registration each: where the file goes, where it is
registered, its interface, and what is registered now (read from the live registry). The docs'
reference page is generated from this table, and a test registers a throwaway of several kinds."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from harness.cli.commands import COMMANDS
from harness.cli.commands.base import Command
from harness.environments import PROVIDERS
from harness.environments.base import EnvironmentProvider
from harness.execution.launchers import LAUNCHERS
from harness.execution.launchers.base import Launcher
from harness.pipeline.executors import EXECUTORS
from harness.pipeline.executors.base import Executor
from harness.reports.finalize import WRITERS
from harness.reports.finished import FinishedRun
from repros.runtime.kinds import KINDS
from repros.runtime.kinds.base import ReproKind
from repros.runtime.measures import METERS
from repros.runtime.measures.base import Meter
from repros.trainer import grid_axes
from repros.trainer.grid_axes import AXES
from repros.trainer.guards import GUARDS, GuardRule


@dataclass(frozen=True)
class ExtensionPoint:
    kind: str
    #: The interface a new one implements (a class or a callable's shape), dotted.
    interface: str
    #: Where its file goes.
    directory: str
    #: ``module:NAME`` of the registry it is added to.
    registry: str
    registered: Callable[[], Iterable[str]]
    documented_by: object

    def describe(self) -> str:
        return inspect.getdoc(self.documented_by) or ""


def _writer_interface(run: FinishedRun) -> None:
    """A report writer: ``write(run: FinishedRun) -> Path`` reads the run's records and ``run.json``
    and writes one file into the run directory (``harness/reports/junit.py`` is one)."""


EXTENSION_POINTS: tuple[ExtensionPoint, ...] = (
    ExtensionPoint(
        "launcher",
        "harness.execution.launchers.base.Launcher",
        "harness/execution/launchers/",
        "harness/execution/launchers/__init__.py:LAUNCHERS",
        lambda: list(LAUNCHERS),
        Launcher,
    ),
    ExtensionPoint(
        "executor",
        "harness.pipeline.executors.base.Executor",
        "harness/pipeline/executors/",
        "harness/pipeline/executors/__init__.py:EXECUTORS",
        lambda: list(EXECUTORS),
        Executor,
    ),
    ExtensionPoint(
        "environment provider",
        "harness.environments.base.EnvironmentProvider",
        "harness/environments/",
        "harness/environments/__init__.py:PROVIDERS",
        lambda: list(PROVIDERS),
        EnvironmentProvider,
    ),
    ExtensionPoint(
        "measure (a meter a rank runs)",
        "repros.runtime.measures.base.Meter",
        "repros/runtime/measures/",
        "repros/runtime/measures/__init__.py:METERS",
        lambda: list(METERS),
        Meter,
    ),
    ExtensionPoint(
        "report writer",
        "write(run: FinishedRun) -> Path",
        "harness/reports/",
        "harness/reports/finalize.py:WRITERS",
        lambda: list(WRITERS),
        _writer_interface,
    ),
    ExtensionPoint(
        "repro kind",
        "repros.runtime.kinds.base.ReproKind",
        "repros/runtime/kinds/",
        "repros/runtime/kinds/__init__.py:KINDS",
        lambda: list(KINDS),
        ReproKind,
    ),
    ExtensionPoint(
        "command-line verb",
        "harness.cli.commands.base.Command",
        "harness/cli/commands/",
        "harness/cli/commands/__init__.py:COMMANDS",
        lambda: [c.name for c in COMMANDS],
        Command,
    ),
    ExtensionPoint(
        "guard of the fixed trainer",
        "repros.trainer.guards.GuardRule",
        "(a row)",
        "repros/trainer/guards.py:GUARDS",
        lambda: [g.id for g in GUARDS],
        GuardRule,
    ),
    ExtensionPoint(
        "config-grid axis",
        "axis -> value -> Scenario fields",
        "(a row)",
        "repros/trainer/grid_axes.py:AXES",
        lambda: list(AXES),
        grid_axes,
    ),
)
