"""A command-line option, declared once: its destination, its flags, its help and how its value is read.

The verbs and the pytest plugin add the options they take from ``harness/cli/options.py``'s table;
an executor declares its own (``options`` on its class, ``harness/pipeline/executors``), which every
verb that runs items and the pytest plugin add beside the others.
"""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.core.as_of import as_of_value
from harness.core.paths import path_problem, shown


@dataclass(frozen=True)
class Option:
    dest: str
    flags: tuple[str, ...]
    help: str
    #: ``text``, ``texts`` (repeatable), ``csv`` (comma-separated, repeatable), ``path``, ``paths`` (repeatable),
    #: ``choice``, ``int``,
    #: ``date`` (YYYY-MM-DD or a UTC time, up to today), ``gb`` (a size in GB, more than 0).
    kind: str = "text"
    #: What it accepts: a fixed tuple, or a registry read when the value is checked (a later
    #: registration counts).
    choices: Collection[str] = ()
    default: Callable[[], Any] | None = None
    metavar: str | None = None
    #: The flags under pytest, where they differ from ``flags``.
    pytest_flags: tuple[str, ...] | None = None
    #: ``int``: the least value it takes (its message says so).
    minimum: int = 0

    def argparse_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"dest": self.dest, "help": self.help}
        if self.metavar:
            kwargs["metavar"] = self.metavar
        if self.kind in ("csv", "paths", "texts"):
            kwargs["action"] = "append"
            kwargs["default"] = []
        if self.kind in ("path", "paths"):
            kwargs["type"] = path_value
        if self.kind == "int":
            kwargs["type"] = whole_number(self.flags[0], self.minimum)
        if self.kind == "date":
            kwargs["type"] = past_as_of(self.flags[0])
        if self.kind == "gb":
            kwargs["type"] = gigabytes(self.flags[0])
        if self.kind == "choice":
            kwargs["choices"] = self.choices
        if self.default is not None and self.kind not in ("csv", "paths", "texts"):
            kwargs["default"] = self.default()
        return kwargs


def past_as_of(flag: str) -> Callable[[str], str]:
    def parse(value: str) -> str:
        try:
            moment = as_of_value(value)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{flag} takes a day, YYYY-MM-DD, or a UTC time, YYYY-MM-DDTHH:MM:SSZ, not {value!r}"
            ) from None
        if moment[:10] > dt.date.today().isoformat():
            raise argparse.ArgumentTypeError(f"{flag} {value} is in the future: give a day up to today")
        return moment

    return parse


def path_value(value: str) -> Path:
    """argparse's type for a path argument: refused as it is parsed where it could not be a path
    (argparse names the argument)."""
    problem = path_problem(Path(value)) if value else "is empty"
    if problem:
        raise argparse.ArgumentTypeError(f"{shown(value)} {problem}")
    return Path(value)


def gigabytes(flag: str) -> Callable[[str], float]:
    def parse(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            number = -1.0
        if not 0 < number < 1e6:
            raise argparse.ArgumentTypeError(f"{flag} takes a size in GB greater than 0, not {value!r}")
        return number

    return parse


def whole_number(flag: str, minimum: int = 0) -> Callable[[str], int]:
    """A parser of whole numbers from ``minimum`` up, whose refusal says what it takes."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            number = minimum - 1
        if number < minimum:
            raise argparse.ArgumentTypeError(f"{flag} takes a whole number ({minimum} or more), not {value!r}")
        return number

    return parse
