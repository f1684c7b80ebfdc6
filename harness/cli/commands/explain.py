"""``explain LOG``: which documented failure a traceback or CI log shows (``-``: stdin), which
versions the harness measured as affected and fixed, where your versions fall, and what each
workaround costs; or "not a documented failure" with the closest candidates. The whole log is read,
line by line, in bounded memory (``harness/analysis/explain/logs.py``), and lines are numbered as
``grep -n`` numbers them.

Exit status: 0 when the log shows a documented failure (or one of your repros' failures), 1 when
not, 2 for a usage error.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from harness.analysis.explain.report import run_explain
from harness.cli import options
from harness.cli.commands.base import Command


class ExplainCommand(Command):
    name = "explain"
    help = "say which documented failure a traceback or CI log shows, what was measured about it, and the workarounds"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("log", metavar="LOG", help="a traceback or CI log file; - reads stdin")
        versions = parser.add_mutually_exclusive_group()
        versions.add_argument(
            "--freeze", type=Path, metavar="FILE", help="your installed versions, as 'pip freeze' writes them"
        )
        versions.add_argument(
            "--installed",
            action="store_true",
            help="your installed versions are those of the interpreter running this command",
        )
        parser.add_argument(
            "--costs",
            type=Path,
            metavar="FILE",
            help="what each workaround costs, a costs.json from 'costs' (default: the newest one under --reports-dir)",
        )
        options.add_cli_options(parser, ("reports_dir", "matrix", "repros_dir"))

    def run(self, args: argparse.Namespace, console: Console, argv: Sequence[str]) -> int:
        repros_dirs = options.check_repros_dirs(args.repros_dir)
        return run_explain(
            args.log, args.freeze, args.installed, args.costs, args.reports_dir, args.matrix, repros_dirs, console
        )
