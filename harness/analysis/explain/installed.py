"""A user's installed versions for ``explain``: from ``pip freeze`` output, or from the interpreter running
this, read as every stack is (``harness/environments/stacks.py``).

Names are canonical (``packaging``); versions as installed (``2.13.0+cpu``). In ``pip freeze``
output, ``name==version`` lines count; a direct reference (``name @ file:///.../name-1.2-...whl``)
counts when its wheel or sdist file name carries the version; editable installs, options, comments and
unpinned requirements are skipped (a log is explained with what can be read). The file is read as
``atlas check --requirements`` reads one (``stacks.read_pins``): markers evaluated for this platform,
``-r`` includes followed, a package pinned twice for this platform refused.
"""

from __future__ import annotations

from pathlib import Path

from harness.environments.stacks import read_pins, stack_here


def from_freeze(path: Path) -> dict[str, str]:
    """Package -> version from ``pip freeze`` output (or a requirements file of pins) in ``path``."""
    return read_pins(path, "--freeze", strict=False)


def here() -> dict[str, str]:
    """Package -> version of every distribution the running interpreter has."""
    return dict(stack_here().versions)
