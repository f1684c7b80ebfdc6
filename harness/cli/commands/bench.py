"""``bench``: the selected items under bare torchrun and through the harness, interleaved."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from harness.analysis.bench import BenchOptions, run_bench
from harness.analysis.executor_bench import run_executor_bench
from harness.cli import options
from harness.cli.commands.base import Command
from harness.core.errors import UserError
from harness.pipeline.session import new_run_id


class BenchCommand(Command):
    name = "bench"
    help = "time items under bare torchrun and through the harness, interleaved, and what they cost"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        options.add_cli_options(parser, ("matrix", "lane", "cells", "repros", "modes"))
        parser.add_argument("--rounds", type=int, default=2, help="rounds of bare torchrun then harness (default 2)")
        options.add_cli_options(parser, ("out", "cache_dir", "model", "world_size"))
        parser.add_argument(
            "--no-cold", action="store_true", help="skip the cold environment build and the JIT timings"
        )
        parser.add_argument("--no-jobs", action="store_true", help="skip the --jobs 0 harness run")
        parser.add_argument(
            "--no-bare",
            action="store_true",
            help="time only the harness rounds (no bare torchrun), and print items per minute and the time from "
            "launch to the first step per device",
        )
        parser.add_argument(
            "--executors",
            action="store_true",
            help="then items per minute on the same selection: local, and a Ray cluster of 1 and 2 nodes started "
            "here (needs ray)",
        )

    def run(self, args: argparse.Namespace, console: Console, argv: Sequence[str]) -> int:
        if args.rounds < 1:
            raise UserError("command line", "--rounds", f"{args.rounds} runs nothing", "pass --rounds 2 for A B A B")
        opts = options.selection(vars(args))
        out = args.out or Path("reports") / f"bench-{new_run_id()}"
        bench = BenchOptions(
            run=opts,
            rounds=args.rounds,
            out=out.resolve(),
            cold=not args.no_cold,
            jobs_probe=not args.no_jobs,
            bare=not args.no_bare,
        )
        status = run_bench(bench, console)
        if args.executors:
            selection = ["--matrix", str(opts.matrix.path)]
            chosen = opts.selection
            for flag, values in (("--cells", chosen.cells), ("--repros", chosen.repros), ("--modes", chosen.modes)):
                if values:
                    selection += [flag, ",".join(values)]
            if chosen.lane and not chosen.cells:
                selection += ["--lane", chosen.lane]
            run_executor_bench(selection, out.resolve() / "executors", cpus_per_node=2, console=console)
        return status
