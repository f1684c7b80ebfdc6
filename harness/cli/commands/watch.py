"""``watch``: run the lane tonight, compare with the previous night, explain every change."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from harness.cli import options
from harness.cli.commands.base import Command
from harness.core.option import whole_number
from harness.workflows.watch.classify import DEFAULT_CONFIRM
from harness.workflows.watch.runner import WatchOptions, execute_watch


class WatchCommand(Command):
    name = "watch"
    help = "run the lane and name the release that changed each outcome since the previous night"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--previous",
            type=Path,
            required=True,
            metavar="DIR",
            help="the previous night's run directory (results.jsonl and run.json)",
        )
        options.add_cli_options(parser, ("matrix", "lane", "cells", "repros", "modes", "out", "reports_dir"))
        options.add_cli_options(parser, (*options.CACHE_OPTIONS, "repros_dir"))
        options.add_executor_options(parser)
        # --pin here asks what an upgrade would change, against a run of the current lock given as --previous.
        options.add_cli_options(parser, options.STACK_OPTIONS)
        parser.add_argument(
            "--confirm",
            type=whole_number("--confirm"),
            default=DEFAULT_CONFIRM,
            metavar="N",
            help=f"where nothing moved under a changed item, run it N more times (default {DEFAULT_CONFIRM})",
        )
        parser.add_argument("--markdown", type=Path, metavar="FILE", help="also append the summary of changes to FILE")
        update = parser.add_mutually_exclusive_group()
        update.add_argument(
            "--update-expectations",
            dest="update_expectations",
            action="store_true",
            default=None,
            help="write the new expectation of each documented failure that stopped reproducing",
        )
        update.add_argument(
            "--no-update-expectations",
            dest="update_expectations",
            action="store_false",
            help="never ask (default on a terminal: ask for each)",
        )

    def run(self, args: argparse.Namespace, console: Console, argv: Sequence[str]) -> int:
        run = options.selection(vars(args), out_dir=args.out, explore=False)
        opts = WatchOptions(
            run=run,
            previous=args.previous,
            confirm=args.confirm,
            markdown=args.markdown,
            update_expectations=args.update_expectations,
        )
        return execute_watch(opts, console, argv)
