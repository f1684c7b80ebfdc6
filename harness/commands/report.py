"""``report DIR``: print a finished run's table again and rewrite its reports."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from harness.commands.base import Command
from harness.finalize import finalize
from harness.pipeline import exit_status
from harness.run_dir import RunDir
from harness.summary import print_summary


class ReportCommand(Command):
    name = "report"
    help = "print a run's summary again and rewrite its reports (junit.xml, index.html)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("dir", type=Path)

    def run(self, args: argparse.Namespace, console: Console, argv: Sequence[str]) -> int:
        run_dir = RunDir.existing(args.dir)
        with run_dir.locked():
            records = run_dir.records()
            meta = run_dir.read_meta()
            print_summary(console, records, meta.get("excluded") or [])
            for path in finalize(run_dir):
                console.print(f"report: {path}", highlight=False, markup=False)
        return exit_status(records)
