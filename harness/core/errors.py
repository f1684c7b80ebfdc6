"""Errors a user can cause: one clear line naming the file, the field and the fix."""

from __future__ import annotations

from pathlib import Path

#: Exit status for a usage or configuration error.
EXIT_USAGE = 2


class UserError(Exception):
    """A mistake in a matrix file or on the command line. ``str()`` is the one line
    the CLI prints before exiting with status 2."""

    def __init__(self, where: str | Path, field: str, problem: str, fix: str) -> None:
        self.where = str(where)
        self.field = field
        self.problem = problem
        self.fix = fix
        super().__init__(self.line())

    def line(self) -> str:
        field = f" {self.field}:" if self.field else ""
        return f"{self.where}:{field} {self.problem}; {self.fix}"
