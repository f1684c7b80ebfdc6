"""The environment a child interpreter of ours starts with."""

from __future__ import annotations

import os


def isolated_environ() -> dict[str, str]:
    """The caller's environment without what would make an interpreter see other packages."""
    drop = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP"}
    return {**{k: v for k, v in os.environ.items() if k not in drop}, "PYTHONNOUSERSITE": "1"}
