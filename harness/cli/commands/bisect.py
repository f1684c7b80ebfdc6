"""``bisect``: which release (or day) of a package changed a repro's outcome."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from packaging.utils import canonicalize_name
from rich.console import Console

from harness.cli import options
from harness.cli.commands.base import Command
from harness.workflows.bisect.runner import BisectOptions, execute_bisect


class BisectCommand(Command):
    name = "bisect"
    help = "find the release of a package that changed a repro's outcome"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--repro", required=True, help="the repro whose outcome changed: its id (F1, or your repro.yaml's id)"
        )
        parser.add_argument(
            "--mode",
            default="bug",
            help="the mode whose outcome changed: bug (the configuration that fails, default) or fixed (the "
            "workaround)",
        )
        parser.add_argument("--package", help="the package whose releases to bisect")
        parser.add_argument("--good", required=True, help="a release (a date with --by-date) with the good outcome")
        parser.add_argument("--bad", required=True, help="a release (a date with --by-date) with the bad outcome")
        parser.add_argument(
            "--by-date",
            action="store_true",
            help="bisect over days: resolve the base cell's packages, unpinned, as of each day",
        )
        parser.add_argument(
            "--hold",
            action="append",
            default=[],
            metavar="PKG",
            help="with --by-date: keep this package at the base cell's spec (repeatable; e.g. torch)",
        )
        options.add_cli_options(parser, ("matrix",))
        parser.add_argument(
            "--cells",
            "--cell",
            dest="cell",
            metavar="CELL",
            help="the base cell, one of the matrix (its other packages stay as they are; default: the first cell of "
            "the default lane); --cell is another name for it",
        )
        options.add_cli_options(parser, ("out", "reports_dir", "cache_dir", "cache_max_gb"))
        parser.add_argument("--pre", action="store_true", help="include pre-releases")
        parser.add_argument(
            "--verify",
            type=int,
            default=0,
            metavar="K",
            help="probe K more untested releases to catch a non-monotonic history",
        )
        options.add_cli_options(parser, ("repros_dir", "as_of"))
        # A bisect runs one step at a time: where it runs, not how many at once.
        options.add_executor_options(parser, jobs=False)

    def run(self, args: argparse.Namespace, console: Console, argv: Sequence[str]) -> int:
        opts = BisectOptions(
            run=options.selection(vars(args), out_dir=args.out),
            repro=args.repro,
            mode=args.mode,
            package=canonicalize_name(args.package) if args.package else None,
            by_date=args.by_date,
            hold=tuple(canonicalize_name(h) for h in args.hold),
            good=args.good,
            bad=args.bad,
            cell=args.cell,
            pre=args.pre,
            verify=args.verify,
        )
        return execute_bisect(opts, console)
