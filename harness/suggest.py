"""Near names for a name the user mistyped (a repro, a cell): difflib's close matches."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def near(name: str, known: Iterable[str], limit: int = 3) -> list[str]:
    """The known names closest to ``name``, closest first (case is ignored)."""
    names = sorted(set(known))
    by_lower = {n.lower(): n for n in names}
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=limit, cutoff=0.5)
    return [by_lower[c] for c in close]


def one_of(name: str, known: Iterable[str]) -> str:
    """``did you mean X? use one of: ...``, or ``use one of: ...`` when nothing is close."""
    names = sorted(set(known))
    close = near(name, names)
    listed = f"use one of: {', '.join(names)}" if names else "none is defined"
    return f"did you mean {' or '.join(close)}? ({listed})" if close else listed


def unknown_repro_fix(name: str, known: Iterable[str]) -> str:
    """The fix for an unknown repro id: the near ids, the known ones, and where a user's repros come from."""
    return (
        f"{one_of(name, known)}; a repro of your own is found with --repros-dir DIR (the directory of its file), "
        "$FT_REGRESS_REPROS or the matrix's repros_dirs"
    )
