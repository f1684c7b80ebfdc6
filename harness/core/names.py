"""Near names for a name the user mistyped (a repro, a cell): difflib's close matches."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable


def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """Order names as people count: F1, F2, ..., F10 (not F1, F10, F2)."""
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", name) if part)


def near(name: str, known: Iterable[str], limit: int = 3) -> list[str]:
    """The known names closest to ``name``, closest first (case is ignored)."""
    names = sorted(set(known), key=natural_key)
    by_lower = {n.lower(): n for n in names}
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=limit, cutoff=0.5)
    return [by_lower[c] for c in close]


def one_of(name: str, known: Iterable[str]) -> str:
    """``did you mean X? use one of: ...``, or ``use one of: ...`` when nothing is close."""
    names = sorted(set(known), key=natural_key)
    close = near(name, names)
    listed = f"use one of: {', '.join(names)}" if names else "none is defined"
    return f"did you mean {' or '.join(close)}? ({listed})" if close else listed


def unknown_repro_fix(name: str, known: Iterable[str]) -> str:
    """The fix for an unknown repro id: the near ids, the known ones, and where a user's repros come from."""
    return (
        f"{one_of(name, known)}; a repro of your own is found with --repros-dir DIR (the directory of its file), "
        "$FT_REGRESS_REPROS or the matrix's repros_dirs"
    )
