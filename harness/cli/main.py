"""Command line: ``ft-regress`` (or ``python -m harness``) and a verb; ``ft-regress VERB --help`` for each.

Exit status (run): 0 when every observation matched its expectation, or was explored (a
finding), 1 when one did not or an explored item could not run; (explain): 0 when the log
shows a documented failure; 2 for a usage or configuration error (one line naming the file, the field and the fix;
nothing is run, and no result already written is lost).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from rich.console import Console

from harness.cli.commands import COMMANDS
from harness.core.errors import EXIT_USAGE, UserError, one_line
from harness.core.invocation import program_text
from harness.core.option import path_value
from harness.core.text import plain
from repros.runtime.registry import RegistryClash


def program_name() -> str:
    """How the user called us: the installed ``ft-regress``, or ``python -m harness``."""
    return program_text()


class Parser(argparse.ArgumentParser):
    """argparse, its usage errors one line (what is wrong and where help is) and exit status 2."""

    def error(self, message: str) -> NoReturn:
        line = one_line(plain(f"{self.prog}: {message}; see '{self.prog} --help'"))
        self.exit(EXIT_USAGE, f"error: {line}\n")


def checked_paths(parser: argparse.ArgumentParser) -> None:
    """Every path argument of every verb (``type=Path``) refused as it is parsed where it could not
    be a path (empty, a name too long: every look-up of it would raise)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for verb in dict.fromkeys(action.choices.values()):
                checked_paths(verb)
        elif action.type is Path:
            action.type = path_value


def parser() -> argparse.ArgumentParser:
    root = Parser(prog=program_name(), description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = root.add_subparsers(dest="command", required=True)
    for command_class in COMMANDS.values():
        command = command_class()
        verb = sub.add_parser(command.name, help=command.help, description=command.help)
        command.add_arguments(verb)
        verb.set_defaults(handler=command)
    checked_paths(root)
    return root


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser().parse_args(argv)
    except RegistryClash as exc:  # two installed packages give one verb (or a choice) one name
        print(f"error: {plain(one_line(str(exc)))}", file=sys.stderr)
        return EXIT_USAGE
    # In a CI log (not a terminal) rich would wrap at 80 columns: give tables room and
    # never break a printed line, so messages and commands stay whole and greppable.
    console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 160)
    try:
        return int(args.handler.run(args, console, argv))
    except UserError as exc:
        print(f"error: {plain(exc.line())}", file=sys.stderr)
        return EXIT_USAGE
    except RegistryClash as exc:  # two installed packages give an extension one name
        print(f"error: {plain(one_line(str(exc)))}", file=sys.stderr)
        return EXIT_USAGE
