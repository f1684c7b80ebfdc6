"""A command-line verb: its options and what it does. Registered in ``harness/commands/__init__.py``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import ClassVar

from rich.console import Console


class Command:
    name: ClassVar[str]
    help: ClassVar[str]

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """The verb's own options (shared ones come from ``harness.options``)."""

    def run(self, args: argparse.Namespace, console: Console, argv: Sequence[str]) -> int:
        """Do it; return the exit status. A ``UserError`` becomes one line and exit 2."""
        raise NotImplementedError
