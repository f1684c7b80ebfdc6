"""How the user runs this harness, for every command it prints or records (``repro_cmd``, the
resume line, ``established_by``): the installed ``ft-regress``, or ``python -m harness`` from a
checkout. A printed command must work where the user typed the one that printed it."""

from __future__ import annotations

import os
import sys

#: The console script ``pip install`` puts on the PATH (pyproject's ``[project.scripts]``).
CONSOLE_SCRIPT = "ft-regress"


def program() -> list[str]:
    """``["ft-regress"]`` when started as the console script, else ``["python", "-m", "harness"]``."""
    invoked = os.path.basename(sys.argv[0]) if sys.argv else ""
    return [CONSOLE_SCRIPT] if invoked == CONSOLE_SCRIPT else ["python", "-m", "harness"]


def program_text() -> str:
    return " ".join(program())
