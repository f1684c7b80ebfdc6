"""``list``: the repros, and the matrix's lanes and cells."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from rich.console import Console
from rich.text import Text

from harness.cli import options
from harness.cli.commands.base import Command
from harness.config.locate import NoMatrix
from harness.config.repros import discover
from harness.core.text import plain
from harness.environments.specs import NEWEST


class ListCommand(Command):
    name = "list"
    help = "list the repros and the matrix's cells and lanes"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        options.add_cli_options(parser, ("matrix", "repros_dir"))

    def run(self, args: argparse.Namespace, console: Console, argv: Sequence[str]) -> int:
        missing: NoMatrix | None = None
        try:
            matrix, discovery = options.load(args.matrix, args.repros_dir)
        except NoMatrix as exc:
            # No matrix anywhere: the repros can still be listed; cells and lanes need one.
            missing, matrix, discovery = exc, None, discover(options.check_repros_dirs(args.repros_dir))
        for repro in discovery.repros.values():
            line = Text(repro.id, style="bold")
            line.append(plain(f" {repro.spec.title} ({repro.module}; modes {', '.join(repro.spec.modes)})"))
            console.print(line, highlight=False)
        for stem, broken in discovery.broken.items():
            console.print(plain(f"broken: {stem} ({broken.module}): {broken.reason}"), highlight=False, markup=False)
        if matrix is None:
            assert missing is not None
            console.print(plain(f"no matrix: {missing.problem}; {missing.fix}"), highlight=False, markup=False)
            return 0
        # The matrix's own text (a lane's description, a name) is the user's: shown as it reads, its
        # control characters and bidirectional overrides made visible, never taken as markup.
        for lane, description in matrix.lanes.items():
            cells = ", ".join(c.name for c in matrix.cells.values() if lane in c.lanes)
            line = Text("lane ").append(plain(lane), style="bold")
            line.append(plain(f"{': ' + description if description else ''} — {cells}"))
            console.print(line, highlight=False)
        for cell in matrix.cells.values():
            pins = (
                " ".join(f"{k}{v}" if v != NEWEST else f"{k}(newest)" for k, v in cell.packages.items())
                + (" (release candidates too)" if cell.prerelease else "")
                if cell.installs_packages
                else f"provider {cell.provider}"
            )
            line = Text("cell ").append(plain(cell.name), style="bold")
            line.append(plain(f" (world size {cell.world_size}): {pins}"))
            console.print(line, highlight=False)
        return 0
