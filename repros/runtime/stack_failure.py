"""Whether an exception a rank raised is the cell's stack failing, not the scenario. Standard library only.

A package that does not import (deepspeed 0.19.2 on Python 3.12 without setuptools' ``distutils``
shim: ``ModuleNotFoundError: No module named 'distutils'`` from deepspeed's own imports), or a
package the cell does not have at all (a passthrough interpreter without bitsandbytes), is not what
a repro observes: its item is INFRA with this reason, in both modes. The orchestrator decides (a
documented signature that names an import error still wins, ``harness/execution/classify.py``);
the rank only says what failed, since only the rank sees its own ``sys.path``.

Two shapes count:

* an ``ImportError`` raised while an installed package's module-level code ran (the traceback passes
  through a ``<module>`` frame of a file of a package some installed distribution provides; the
  project's own modules and a user's script are none): that package does not import;
* a ``ModuleNotFoundError`` for a top-level module nothing on ``sys.path`` provides, raised by the
  project's own code: the cell lacks that package.

Anything else (``cannot import name`` from inside a library's function, an attribute missing in a
release) stays an ordinary error of the scenario.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import traceback
from collections.abc import Mapping
from importlib import metadata

#: Packages that are the project's own, wherever they are installed.
_OURS = frozenset({"repros", "harness"})


def _package_of(filename: str) -> str | None:
    """The top-level package a file belongs to: its first directory below the ``sys.path`` entry
    that holds it (the longest such entry), or the module itself for a top-level file."""
    path = os.path.abspath(filename)
    roots = sorted((os.path.abspath(p) for p in sys.path if p), key=len, reverse=True)
    for root in roots:
        if path.startswith(root.rstrip(os.sep) + os.sep):
            first = path[len(root.rstrip(os.sep)) + 1 :].split(os.sep, 1)[0]
            return first[:-3] if first.endswith(".py") else first
    return None


def _installed(top_level: str) -> bool:
    try:
        return importlib.util.find_spec(top_level) is not None
    except (ImportError, ValueError):
        return False


def stack_failure(exc: BaseException) -> str | None:
    """The reason the cell's stack failed, where ``exc`` is such a failure; None for any other error."""
    if not isinstance(exc, ImportError):
        return None
    message = f"{type(exc).__name__}: {exc}"
    distributed: Mapping[str, list[str]] | None = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.name != "<module>" or frame.filename.startswith("<"):
            continue
        package = _package_of(frame.filename)
        if package is None or package in _OURS:
            continue
        if distributed is None:
            distributed = metadata.packages_distributions()
        if package in distributed:
            return f"{package} does not import in this cell: {message}"
    name = getattr(exc, "name", None)
    if isinstance(exc, ModuleNotFoundError) and name:
        top_level = name.partition(".")[0]
        if not _installed(top_level):
            return f"{top_level} is not installed in this cell ({message})"
    return None
