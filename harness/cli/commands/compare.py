"""``compare OLD NEW``: what changed between two runs, as markdown; exit 1 on a new regression."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from harness.analysis.compare import NEW_REGRESSION, Thresholds, compare_runs, markdown
from harness.cli.commands.base import Command
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
        changes = compare_runs(old, new, limits)
        text = markdown(changes, args.old.name, args.new.name)
        print(text)
        if args.markdown:
            args.markdown.write_text(text)
        return 1 if any(c.kind == NEW_REGRESSION for c in changes) else 0
