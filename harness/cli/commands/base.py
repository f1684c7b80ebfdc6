"""A command-line verb: its options and what it does. Registered in ``harness/cli/commands/__init__.py``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import ClassVar

from rich.console import Console


class Command:
    """A command-line verb: ``name`` and ``help``, the options it takes (``add_arguments``; the
    shared ones from ``harness/cli/options.py``) and what it does (``run``, returning the exit
    status). Keep it thin: parse, call the stage that does the work, return."""

    name: ClassVar[str]
    help: ClassVar[str]

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """The verb's own options (shared ones come from ``harness.cli.options``)."""

    def run(self, args: argparse.Namespace, console: Console, argv: Sequence[str]) -> int:
        """Do it; return the exit status. A ``UserError`` becomes one line and exit 2."""
        raise NotImplementedError
