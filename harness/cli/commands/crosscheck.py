"""``crosscheck``: every training strategy a cell's stack offers, held against one process training the same
adapter on the same global batch."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from harness.cli import options
from harness.cli.commands.base import Command
from harness.core.option import whole_number
from harness.records.run_meta import new_run_id
from harness.workflows.crosscheck import CrosscheckRequest, run_crosscheck
from repros.trainer.crosscheck.training import Breakage


class CrosscheckCommand(Command):
    name = "crosscheck"
    help = (
        "hold every training strategy (DDP, ZeRO 0-3, FSDP1/2; precisions, checkpointing, accumulation) against one "
        "process training the same adapter"
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        options.add_cli_options(parser, ("matrix", "lane", "cells"))
        parser.add_argument(
            "--strategies",
            action="append",
            default=[],
            metavar="S1,S2",
            help="strategies by name or shell-style pattern (zero3-bf16-ckpt-nr, 'zero*-fp32'); "
            "default: the lane's, as the matrix's crosscheck section says (every pair of parts otherwise)",
        )
        parser.add_argument(
            "--steps",
            type=whole_number("--steps", 1),
            default=None,
            metavar="N",
            help="optimizer steps each strategy trains (default: the matrix's, else 4)",
        )
        parser.add_argument(
            "--seed",
            type=whole_number("--seed", 0),
            default=0,
            help="the seed of the model's weights and the data (default 0; with --repeat N the attempts train from "
            "seed, seed+1, ...)",
        )
        parser.add_argument(
            "--break",
            dest="breakage",
            choices=Breakage.KINDS,
            default=None,
            help="put a deliberate fault into every strategy (never the reference), to prove the comparison "
            "catches it on this stack: each item must then DIVERGE",
        )
        parser.add_argument(
            "--list", action="store_true", help="print the strategies the selection holds, one a line, and run nothing"
        )
        options.add_cli_options(parser, ("out", "reports_dir", *options.CACHE_OPTIONS, *options.ATTEMPT_OPTIONS))
        options.add_cli_options(parser, options.STACK_OPTIONS)
        options.add_executor_options(parser)

    def run(self, args: argparse.Namespace, console: Console, argv: Sequence[str]) -> int:
        opts = options.selection(vars(args))
        out = Path(args.out or opts.reports_dir / f"crosscheck-{new_run_id()}")
        request = CrosscheckRequest(
            strategies=tuple(s.strip() for given in args.strategies for s in given.split(",") if s.strip()),
            steps=args.steps,
            seed=args.seed,
            breakage=args.breakage,
            list_only=args.list,
        )
        return run_crosscheck(opts, request, out, console, argv)
