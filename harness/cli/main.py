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

from rich.console import Console

from harness.cli.commands import COMMANDS
from harness.core.errors import EXIT_USAGE, UserError
from harness.core.invocation import program_text
from harness.core.text import plain


def program_name() -> str:
    """How the user called us: the installed ``ft-regress``, or ``python -m harness``."""
    return program_text()


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(
        prog=program_name(), description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = root.add_subparsers(dest="command", required=True)
    for command_class in COMMANDS:
        command = command_class()
        verb = sub.add_parser(command.name, help=command.help, description=command.help)
        command.add_arguments(verb)
        verb.set_defaults(handler=command)
    return root


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    # In a CI log (not a terminal) rich would wrap at 80 columns: give tables room and
    # never break a printed line, so messages and commands stay whole and greppable.
    console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 160)
    try:
        return int(args.handler.run(args, console, argv))
    except UserError as exc:
        print(f"error: {plain(exc.line())}", file=sys.stderr)
        return EXIT_USAGE
