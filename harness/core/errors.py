"""Errors a user can cause: one clear line naming the file, the field and the fix."""

from __future__ import annotations

from pathlib import Path

#: Exit status for a usage or configuration error.
EXIT_USAGE = 2
#: Exit status of a check that checked nothing (``check``: nothing could run here; ``atlas check``: nothing was
#: answered): never a pass.
EXIT_NOTHING_CHECKED = 2


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
        """One line, always: a newline in what the user gave (``--repros $'F1\\n'``) is shown as ``\\n``."""
        field = f" {self.field}:" if self.field else ""
        return one_line(f"{self.where}:{field} {self.problem}; {self.fix}")


#: Every character ``str.splitlines`` breaks a line at, and how it is shown instead.
_BREAKS = {ord(c): ascii(c)[1:-1] for c in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"}


def one_line(text: str) -> str:
    """``text`` with its line breaks shown as escapes (``\\n``), so that it prints as one line."""
    return text.translate(_BREAKS)
