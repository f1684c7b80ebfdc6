"""Where the matrix comes from: ``--matrix``, else ``./matrix.yaml``, else ``$FT_REGRESS_MATRIX``."""

from __future__ import annotations

import os
from pathlib import Path

from harness.core.errors import UserError
from harness.core.invocation import program_text

MATRIX_VARIABLE = "FT_REGRESS_MATRIX"
DEFAULT_MATRIX_NAME = "matrix.yaml"


class NoMatrix(UserError):
    """No matrix was given or found where one is looked for."""


def find_matrix(given: Path | None, cwd: Path | None = None) -> Path:
    """``--matrix``, else ``./matrix.yaml``, else ``$FT_REGRESS_MATRIX``; a ``UserError`` saying so if none."""
    if given is not None:
        return Path(given)
    here = (cwd or Path.cwd()) / DEFAULT_MATRIX_NAME
    if here.is_file():
        return here
    from_env = os.environ.get(MATRIX_VARIABLE)
    if from_env:
        if not _is_file(Path(from_env)):
            raise UserError(
                f"${MATRIX_VARIABLE}",
                from_env,
                "is not a matrix file",
                "set it to an existing matrix file, or unset it and pass --matrix FILE",
            )
        return Path(from_env)
    raise NoMatrix(
        "--matrix",
        "",
        f"no matrix given, no ./{DEFAULT_MATRIX_NAME} here, and ${MATRIX_VARIABLE} is not set",
        f"pass --matrix FILE, run from a directory with {DEFAULT_MATRIX_NAME}, or run '{program_text()} init' "
        "for a starter",
    )


def _is_file(path: Path) -> bool:
    """Whether ``path`` is a file; False, not an exception, for a name too long to look up."""
    try:
        return path.is_file()
    except OSError:
        return False
