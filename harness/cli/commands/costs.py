"""``costs``: every workaround of the selected repros, in the selected cells, at the small model:
does it train, and what does it cost against the documented configuration."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from harness.cli import options
from harness.cli.commands.base import Command
from harness.core.errors import UserError
from harness.records.run_meta import new_run_id
from harness.workflows.costs import run_costs


class CostsCommand(Command):
    name = "costs"
    help = "run every workaround of the selected repros at the small model: does it train, what does it cost"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        options.add_cli_options(
            parser, ("matrix", "lane", "cells", "repros", "out", "cache_dir", "cache_max_gb", "launcher", "repros_dir")
        )
        # The same stack options as run (every rerun command carries them); --model defaults to small here.
        options.add_cli_options(parser, options.STACK_OPTIONS)
        parser.set_defaults(model="small")
        parser.add_argument(
            "--variants",
            type=options.csv,
            default=(),
            metavar="A,B",
            help="only these variants (default: every one of each selected repro)",
        )
        parser.add_argument(
            "--rounds",
            type=int,
            default=1,
            help="run everything this many times, interleaved, for the run-to-run spread (default 1)",
        )

    def run(self, args: argparse.Namespace, console: Console, argv: Sequence[str]) -> int:
        if args.rounds < 1:
            raise UserError("--rounds", str(args.rounds), "runs nothing", "pass 1 or more")
        base = options.selection(vars(args))
        out = Path(args.out or base.reports_dir / f"costs-{new_run_id()}")
        return run_costs(base, args.variants, args.rounds, out, console, argv)
