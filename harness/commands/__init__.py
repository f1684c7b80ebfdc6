"""The command-line verbs, one class each (``base.Command``), in the order ``--help`` lists them.

A new verb is one module with a ``Command`` subclass, plus its line in ``COMMANDS``.
"""

from __future__ import annotations

from harness.commands.base import Command
from harness.commands.bench import BenchCommand
from harness.commands.bisect import BisectCommand
from harness.commands.catalog import CatalogCommand
from harness.commands.compare import CompareCommand
from harness.commands.costs import CostsCommand
from harness.commands.explain import ExplainCommand
from harness.commands.grid import GridCommand
from harness.commands.init import InitCommand
from harness.commands.listing import ListCommand
from harness.commands.merge import MergeCommand
from harness.commands.report import ReportCommand
from harness.commands.run import RunCommand

COMMANDS: tuple[type[Command], ...] = (
    InitCommand,
    RunCommand,
    MergeCommand,
    BisectCommand,
    BenchCommand,
    CostsCommand,
    GridCommand,
    CompareCommand,
    ExplainCommand,
    ReportCommand,
    ListCommand,
    CatalogCommand,
)

__all__ = ["COMMANDS", "Command"]
