"""The command-line verbs, one class each (``base.Command``), in the order ``--help`` lists them.

A new verb is one module with a ``Command`` subclass, plus its line in ``COMMANDS``, or an installed
package's entry point in the ``ft_regress.commands`` group (listed after the built-in verbs).

``bench`` is the project's own benchmarks (``benchmarks/``, beside the harness, never imported by
it): its line names the class by path, so the verb works wherever the checkout is (a runner's
interpreter with the checkout on ``PYTHONPATH`` has no entry points) and nothing of the harness
imports the benchmarks' modules.
"""

from __future__ import annotations

from harness.cli.commands.atlas import AtlasCommand
from harness.cli.commands.base import Command
from harness.cli.commands.bisect import BisectCommand
from harness.cli.commands.cache import CacheCommand
from harness.cli.commands.catalog import CatalogCommand
from harness.cli.commands.check import CheckCommand
from harness.cli.commands.compare import CompareCommand
from harness.cli.commands.costs import CostsCommand
from harness.cli.commands.crosscheck import CrosscheckCommand
from harness.cli.commands.explain import ExplainCommand
from harness.cli.commands.grid import GridCommand
from harness.cli.commands.init import InitCommand
from harness.cli.commands.listing import ListCommand
from harness.cli.commands.merge import MergeCommand
from harness.cli.commands.report import ReportCommand
from harness.cli.commands.run import RunCommand
from harness.cli.commands.watch import WatchCommand
from repros.runtime.registry import Lazy, Registry, lazy


def _verbs(*commands: type[Command]) -> dict[str, type[Command] | Lazy]:
    return {command.name: command for command in commands}


COMMANDS: Registry[type[Command]] = Registry(
    "command-line verb",
    {
        **_verbs(InitCommand, RunCommand, CheckCommand, MergeCommand, BisectCommand, WatchCommand),
        "bench": lazy("benchmarks.command:BenchCommand"),
        **_verbs(
            CostsCommand,
            GridCommand,
            CrosscheckCommand,
            CompareCommand,
            ExplainCommand,
            AtlasCommand,
            ReportCommand,
            ListCommand,
            CatalogCommand,
            CacheCommand,
        ),
    },
    group="ft_regress.commands",
)

__all__ = ["COMMANDS", "Command"]
