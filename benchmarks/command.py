"""``bench``: the project's benchmarks, one verb and one parser.

- ``bench`` (``bench items``): the selected items under bare torchrun and through the harness,
  interleaved (``items.py``);
- ``bench executors``: items per minute on the same selection, locally and on a Ray cluster of one
  and two nodes started here (``executors.py``; needs ray);
- ``bench report --items 10000``: the HTML report of a run that large, written and opened
  (``report_page.py``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from benchmarks.executors import run_executor_bench
from benchmarks.items import BenchOptions, run_bench
from benchmarks.report_page import run_report_page
from harness.cli import options
from harness.cli.commands.base import Command
from harness.core.errors import UserError
from harness.records.run_meta import new_run_id

ITEMS, EXECUTORS, REPORT = "items", "executors", "report"


class BenchCommand(Command):
    name = "bench"
    help = "the project's benchmarks: items under bare torchrun and the harness, executors, the report at scale"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "what",
            nargs="?",
            choices=(ITEMS, EXECUTORS, REPORT),
            default=ITEMS,
            help="items (default): bare torchrun against the harness, interleaved; executors: items per minute "
            "locally and on a Ray cluster of 1 and 2 nodes started here (needs ray); report: the HTML report of "
            "a run of --items items",
        )
        options.add_cli_options(parser, ("matrix", "lane", "cells", "repros", "modes"))
        parser.add_argument(
            "--rounds", type=int, default=2, help="items: rounds of bare torchrun then harness (default 2)"
        )
        options.add_cli_options(parser, ("out", "cache_dir", "model", "world_size"))
        parser.add_argument(
            "--no-cold", action="store_true", help="items: skip the cold environment build and the JIT timings"
        )
        parser.add_argument("--no-jobs", action="store_true", help="items: skip the --jobs 0 harness run")
        parser.add_argument(
            "--cold-start",
            action="store_true",
            help="items: only a fresh clone's make run: the selection into an empty environment cache, then again "
            "with every environment built; the total, the first record and the split of each",
        )
        parser.add_argument(
            "--no-bare",
            action="store_true",
            help="items: time only the harness rounds (no bare torchrun), and print items per minute and the time "
            "from launch to the first step per device",
        )
        parser.add_argument("--cpus-per-node", type=int, default=2, help="executors: each Ray node's CPUs (default 2)")
        parser.add_argument(
            "--items", type=int, default=10_000, help="report: how many items (rounded down to whole cells)"
        )
        parser.add_argument(
            "--repros-per-cell", type=int, default=100, help="report: repros per cell (each in bug and fixed mode)"
        )
        parser.add_argument(
            "--failing-cells", type=int, default=5, help="report: cells with an item that did not match"
        )
        parser.add_argument("--chromium", help="report: the browser to open the page in (default: $CHROMIUM, chromium)")

    def run(self, args: argparse.Namespace, console: Console, argv: Sequence[str]) -> int:
        if args.what == REPORT:
            return run_report_page(
                args.items, args.repros_per_cell, args.failing_cells, args.chromium, args.out, console
            )
        opts = options.selection(vars(args))
        out = (args.out or Path("reports") / f"bench-{new_run_id()}").resolve()
        if args.what == EXECUTORS:
            selection = ["--matrix", str(opts.matrix.path), *opts.selection.flags(), *opts.stack.flags()]
            run_executor_bench(selection, out, args.cpus_per_node, console)
            return 0
        if args.rounds < 1:
            raise UserError("command line", "--rounds", f"{args.rounds} runs nothing", "pass --rounds 2 for A B A B")
        bench = BenchOptions(
            run=opts,
            rounds=args.rounds,
            out=out,
            cold=not args.no_cold,
            jobs_probe=not args.no_jobs,
            bare=not args.no_bare,
            cold_start_only=args.cold_start,
        )
        return run_bench(bench, console)
