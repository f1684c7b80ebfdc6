"""``grid``: every combination of the config grid, as users write it, in the selected cells."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from harness.cli import options
from harness.cli.commands.base import Command
from harness.records.run_meta import new_run_id
from harness.workflows.grid import run_grid


class GridCommand(Command):
    name = "grid"
    help = "run every combination of the config grid as users write it, in the selected cells, and classify it"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        options.add_cli_options(parser, ("matrix", "lane", "cells"))
        parser.add_argument(
            "--only",
            action="append",
            default=[],
            metavar="AXIS=V1,V2",
            help="restrict an axis to these values (repeatable)",
        )
        options.add_cli_options(parser, ("out", "reports_dir", *options.CACHE_OPTIONS))
        options.add_cli_options(parser, options.STACK_OPTIONS)
        options.add_executor_options(parser)

    def run(self, args: argparse.Namespace, console: Console, argv: Sequence[str]) -> int:
        opts = options.selection(vars(args))
        out = Path(args.out or opts.reports_dir / f"grid-{new_run_id()}")
        return run_grid(opts, args.only, out, console, argv)
