"""``report DIR``: print a finished run's table again and rewrite its reports."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from harness.cli.commands.base import Command
from harness.core.errors import EXIT_USAGE
from harness.core.text import plain
from harness.pipeline.session import exit_status
from harness.records.run_dir import RunDir
from harness.reports.finalize import finalize
from harness.reports.findings import findings_lines
from harness.reports.history import load_history
from harness.reports.terminal import print_summary


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
            print_summary(console, records, meta.excluded)
            for line in findings_lines(records, meta.cells):
                console.print(plain(line), highlight=False, markup=False)
            done = finalize(run_dir)
            for path in done.written:
                console.print(f"report: {path}", highlight=False, markup=False)
        skipped: list[str] = []
        load_history(run_dir.path, skipped=skipped)
        for line in skipped:
            print(f"warning: left out of the history: {plain(line)}", file=sys.stderr)
        for failure in done.failed:
            print(f"error: a report could not be written: {failure}", file=sys.stderr)
        return EXIT_USAGE if done.failed else exit_status(records)
