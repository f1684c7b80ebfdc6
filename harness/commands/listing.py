"""``list``: the repros, and the matrix's lanes and cells."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from rich.console import Console

from harness import options
from harness.commands.base import Command


class ListCommand(Command):
    name = "list"
    help = "list the repros and the matrix's cells and lanes"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        options.add_cli_options(parser, ("matrix", "repros_dir"))

    def run(self, args: argparse.Namespace, console: Console, argv: Sequence[str]) -> int:
        matrix, discovery = options.load(args.matrix, args.repros_dir)
        for repro in discovery.repros.values():
            console.print(
                f"[bold]{repro.id}[/bold] {repro.spec.title} ({repro.module}; modes {', '.join(repro.spec.modes)})",
                highlight=False,
            )
        for stem, broken in discovery.broken.items():
            console.print(f"broken: {stem} ({broken.module}): {broken.reason}", highlight=False, markup=False)
        for lane, description in matrix.lanes.items():
            cells = ", ".join(c.name for c in matrix.cells.values() if lane in c.lanes)
            console.print(
                f"lane [bold]{lane}[/bold]{': ' + description if description else ''} — {cells}", highlight=False
            )
        for cell in matrix.cells.values():
            pins = "passthrough" if cell.passthrough else " ".join(f"{k}{v}" for k, v in cell.packages.items())
            console.print(f"cell [bold]{cell.name}[/bold] (world size {cell.world_size}): {pins}", highlight=False)
        return 0
