"""``merge OUT SHARD_DIR...``: the shards of one sharded run become one run directory."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from harness.analysis.merge import merge_runs
from harness.cli.commands.base import Command
from harness.core.errors import EXIT_USAGE
from harness.reports.finalize import finalize
from harness.reports.terminal import print_summary


class MergeCommand(Command):
    name = "merge"
    help = "combine the output directories of a sharded run into one run directory"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("out", type=Path, help="the merged run's directory (new)")
        parser.add_argument("shards", type=Path, nargs="+", metavar="SHARD_DIR", help="each shard's output directory")

    def run(self, args: argparse.Namespace, console: Console, argv: Sequence[str]) -> int:
        merged = merge_runs(args.out, args.shards)
        print_summary(console, merged.records, merged.meta.excluded)
        for warning in merged.warnings:
            console.print(f"warning: {warning}", highlight=False, markup=False)
        console.print(f"merged {len(args.shards)} shards, {len(merged.records)} records → {args.out}", highlight=False)
        done = finalize(merged.run_dir)
        for path in done.written:
            console.print(f"report: {path}", highlight=False, markup=False)
        for failure in done.failed:
            print(f"error: a report could not be written: {failure}; retry with: report {args.out}", file=sys.stderr)
        return EXIT_USAGE if done.failed else 0
