"""Paths a user gives: refused up front, in one line, where they could not be used (empty, a name
longer than a file system allows, an output directory that is a file or cannot be written)."""

from __future__ import annotations

import os
from pathlib import Path

from harness.core.errors import UserError

#: The longest name one directory entry may have, and the longest path (Linux's NAME_MAX, PATH_MAX).
NAME_MAX = 255
PATH_MAX = 4096
#: Room kept under an output directory for what a run writes there (cells, items, attempts, logs).
OUTPUT_ROOM = 1024


def path_problem(path: Path, room: int = 0) -> str | None:
    """What makes ``path`` unusable as a path at all (empty, a part longer than a file system
    allows, too long with ``room`` bytes more below it), or None. Nothing is looked up: a name too
    long would make every look-up raise."""
    text = str(path)
    if not text or text.isspace():
        return "is empty"
    if "\0" in text:
        return "holds a NUL character"
    for part in Path(text).parts:
        if len(os.fsencode(part)) > NAME_MAX:
            return f"has a part of {len(os.fsencode(part))} bytes, more than a file name may have ({NAME_MAX})"
    full = len(os.fsencode(os.path.abspath(text)))
    if full + room >= PATH_MAX:
        kept = f" with room for what goes under it ({room} bytes)" if room else ""
        return f"is {full} bytes long, more than a path may be{kept} ({PATH_MAX})"
    return None


def shown(value: str, limit: int = 60) -> str:
    """A value as an error message shows it: quoted, escaped, and cut short where it is long."""
    quoted = repr(value)
    return quoted if len(quoted) <= limit else f"{quoted[: limit - 5]}...{quoted[-4:]} ({len(value)} characters)"


def check_path(flag: str, path: Path, room: int = 0) -> Path:
    """``path``, or the ``UserError`` naming ``flag`` where it could not be a path."""
    problem = path_problem(path, room)
    if problem:
        raise UserError(flag, shown(str(path)), problem, f"give {flag} another path")
    return path


def check_output_dir(flag: str, path: Path, writable: bool = True) -> Path:
    """A directory a run writes into (or makes): refused up front where it is a file, where what
    it would be made in is not a directory, or (``writable``) where it cannot be written."""
    check_path(flag, path, room=OUTPUT_ROOM)
    target = Path(path).expanduser().absolute()
    existing = target
    while not os.path.lexists(existing) and existing.parent != existing:
        existing = existing.parent
    if os.path.exists(existing) and not os.path.isdir(existing):
        why = "it is not a directory" if existing == target else f"{existing} is not a directory"
        raise UserError(path, flag, f"cannot be written ({why})", f"give {flag} a directory, or where to make one")
    if writable and not os.access(existing, os.W_OK | os.X_OK):
        why = "permission denied" if existing == target else f"{existing} cannot be written"
        raise UserError(path, flag, f"cannot be written ({why})", f"give {flag} a directory you can write to")
    return path
