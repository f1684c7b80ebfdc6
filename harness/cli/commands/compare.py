"""``compare OLD NEW``: what changed between two runs, as markdown; exit 1 on a new regression, 2 where
nothing could be compared (no item in common), said."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from harness.analysis.compare import NEW_REGRESSION, Thresholds, compare_runs, markdown, unpaired_text
from harness.cli.commands.base import Command
from harness.core.errors import EXIT_USAGE
from harness.core.text import plain
from harness.records.results import torn_line
from harness.records.run_dir import RunDir


class CompareCommand(Command):
    name = "compare"
    help = "classify what changed between two runs (markdown)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("old", type=Path, help="the earlier run's directory")
        parser.add_argument("new", type=Path, help="the later run's directory")
        parser.add_argument("--markdown", type=Path, help="also write the markdown to this file")
        parser.add_argument(
            "--relative",
            type=float,
            default=Thresholds.relative,
            help="relative change flagged in memory and step time (default: %(default)s)",
        )
        parser.add_argument(
            "--memory-floor-mib",
            type=float,
            default=Thresholds.memory_floor_bytes / 2**20,
            help="smallest memory change flagged, MiB (default: %(default)s)",
        )
        parser.add_argument(
            "--time-floor-ms",
            type=float,
            default=Thresholds.time_floor_s * 1000,
            help="smallest step-time change flagged, ms (default: %(default)s)",
        )

    def run(self, args: argparse.Namespace, console: Console, argv: Sequence[str]) -> int:
        limits = Thresholds(
            relative=args.relative,
            memory_floor_bytes=int(args.memory_floor_mib * 2**20),
            time_floor_s=args.time_floor_ms / 1000,
        )
        old = RunDir.existing(args.old).records()
        new = RunDir.existing(args.new).records()
        for records in (old, new):
            torn = torn_line(records)
            if torn is not None:
                print(f"warning: {plain(torn.describe())}: that item is not compared", file=sys.stderr)
        changes = compare_runs(old, new, limits)
        unpaired = unpaired_text(old, new, args.old.name, args.new.name)
        text = markdown(changes, args.old.name, args.new.name, unpaired)
        print(text)
        if args.markdown:
            args.markdown.write_text(text)
        if unpaired:
            print(f"error: {plain(unpaired)}; pass two runs of the same matrix and lane", file=sys.stderr)
            return EXIT_USAGE
        return 1 if any(c.kind == NEW_REGRESSION for c in changes) else 0
