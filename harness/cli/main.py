"""Command line: ``ft-regress`` (or ``python -m harness``) and a verb; ``ft-regress VERB --help`` for each.

What ``--help`` says is ``DESCRIPTION``, written for the one who runs it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import NoReturn

from rich.console import Console

from harness import __version__
from harness.cli.commands import COMMANDS, Command
from harness.core.errors import EXIT_USAGE, UserError, one_line
from harness.core.invocation import program_text
from harness.core.option import path_value
from harness.core.text import plain
from repros.runtime.registry import RegistryClash

#: What ``ft-regress --help`` says above the verbs.
DESCRIPTION = """\
Reproduce the documented failures of LoRA/QLoRA/DoRA fine-tuning stacks across library versions,
and your own training script's, in one environment per matrix cell. Each verb has its own help:
{program} VERB --help.

Exit status (run): 0 when every observation matched its expectation, or was explored (a
finding), 1 when one did not or an explored item could not run; (explain): 0 when the log
shows a documented failure; 2 for a usage or configuration error (one line naming the file, the
field and the fix; nothing is run, and no result already written is lost)."""


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


class BrokenVerb(Command):
    """A verb an installed package declares whose code raised as it was loaded: the other verbs work, and this
    one says which plugin and what it raised (exit 2)."""

    help = "(could not be loaded)"

    def __init__(self, name: str, origin: str, error: BaseException) -> None:
        self.verb = name
        self.origin = origin
        self.error = f"{type(error).__name__}: {error}"

    def warning(self) -> str:
        said = f"the verb '{self.verb}' ({self.origin}) could not be loaded ({self.error}); the other verbs work"
        return one_line(plain(f"warning: {said}"))

    def run(self, args: argparse.Namespace, console: Console, argv: Sequence[str]) -> int:
        raise UserError(
            self.verb,
            "",
            f"the plugin that gives this verb ({self.origin}) raised as it was loaded: {self.error}",
            "fix or uninstall that package",
        )


def _verbs() -> Iterator[Command]:
    """Every verb, in order; one an installed package gives that cannot be loaded as a ``BrokenVerb`` (a
    built-in verb that cannot be loaded is the harness's own bug: raised)."""
    for name in COMMANDS.names():
        try:
            yield COMMANDS[name]()
        except Exception as exc:  # a plugin's code: whatever it raises
            origin = COMMANDS.origin(name)
            if origin == "built in":
                raise
            yield BrokenVerb(name, origin, exc)


def parser(warn: Callable[[str], None] | None = None) -> argparse.ArgumentParser:
    """The command line's parser; ``warn`` is told, in one line each, of every verb plugin that could not be
    loaded (its verb then exits 2 naming it)."""
    root = Parser(
        prog=program_name(),
        description=DESCRIPTION.format(program=program_name()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    root.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = root.add_subparsers(dest="command", required=True)
    for command in _verbs():
        name = command.verb if isinstance(command, BrokenVerb) else command.name
        verb = sub.add_parser(name, help=command.help, description=command.help)
        command.add_arguments(verb)
        verb.set_defaults(handler=command)
        if isinstance(command, BrokenVerb) and warn is not None:
            warn(command.warning())
    checked_paths(root)
    return root


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        root = parser(warn=lambda line: print(line, file=sys.stderr))
        args, extra = root.parse_known_args(argv)
        if extra and not isinstance(args.handler, BrokenVerb):  # a broken verb says what broke, whatever it was given
            root.error(f"unrecognized arguments: {' '.join(extra)}")
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
