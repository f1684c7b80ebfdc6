"""``init [DIR]``: a starter matrix and a starter repro that run as they are.

Writes ``matrix.yaml`` (two cells of one stack, DeepSpeed 0.19.8 and 0.19.2; it names its
repros and where they are), ``train.py`` (a plain LoRA + ZeRO-3 + gradient checkpointing
script, a tiny model with random weights) and ``repro.yaml`` (the script, its arguments, the
error it fails with, a workaround). A file already there is refused unless ``--force``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from rich.console import Console

from harness.cli.commands.base import Command
from harness.core.errors import UserError
from harness.core.invocation import program_text
from harness.core.text import plain

#: The starter files, in ``harness/cli/starter/`` (package data), in the order they are written.
STARTER_FILES = ("matrix.yaml", "train.py", "repro.yaml")


def starter_text(name: str) -> str:
    return resources.files("harness.cli").joinpath("starter", name).read_text(encoding="utf-8")


def write_starter(directory: Path, force: bool = False) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    targets = [directory / name for name in STARTER_FILES]
    if not force:
        for target in targets:
            if target.exists():
                raise UserError(target, "", "already exists", "pass --force to overwrite it, or init another directory")
    for target in targets:
        target.write_text(starter_text(target.name), encoding="utf-8")
    return targets


class InitCommand(Command):
    name = "init"
    help = "write a starter matrix and a starter repro (a plain training script) that run as they are"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "directory", nargs="?", type=Path, default=Path("."), help="where to write them (default: here)"
        )
        parser.add_argument("--force", action="store_true", help="overwrite files already there")

    def run(self, args: argparse.Namespace, console: Console, argv: Sequence[str]) -> int:
        written = write_starter(args.directory, args.force)
        me = program_text()

        def say(line: str) -> None:
            console.print(plain(line), highlight=False, markup=False)

        say(f"wrote {', '.join(str(p) for p in written)}")
        say("next:")
        if args.directory != Path("."):
            say(f"  cd {args.directory}")
        steps = [
            ("run", "explore: where train.py fails and where it runs, per cell"),
            ("run --save-expectations", "keep what it observed, as expectations in repro.yaml"),
            ("bisect --repro my-training --package deepspeed --good 0.19.8 --bad 0.19.2", "which release fixed it"),
            ("explain reports/RUN/items/ds-0.19.2/my-training-bug/rank0.log", "which documented failure it is"),
        ]
        for command, what in steps:
            say(f"  {me} {command}    # {what}")
        say("then put your own training script in train.py's place, and its error in repro.yaml")
        return 0
