"""A signature's regular expression searched in a message, within a bound. Standard library only
(``regex`` is used where it is installed).

A pattern can backtrack for ever on the wrong message (``((a|aa)+)+b`` on a line of ``a``), and
Python's ``re`` has no timeout: a user's signature pattern would hang whoever matches it (the
rank, after the script's error, looking like a script that hangs; the orchestrator). ``search``
bounds it: with the ``regex`` package's timeout where it is installed (the orchestrator's own
dependency; a cell's through transformers), else, on the main thread, by an interval timer (``re``
checks for signals as it matches), else unbounded. A search past ``BUDGET_S`` raises
``PatternRunaway``, which says what it is: a pattern that runs away, not a script that hangs.
"""

from __future__ import annotations

import re
import signal
import threading
from types import FrameType, ModuleType

#: How long one search may take. A signature's search over a message of megabytes takes
#: milliseconds; one still going after this long backtracks without end.
BUDGET_S = 1.0


class PatternRunaway(Exception):
    """A pattern's search ran past its bound: the pattern backtracks without end on this text."""

    def __init__(self, pattern: str, chars: int, budget_s: float) -> None:
        self.pattern = pattern
        self.chars = chars
        self.budget_s = budget_s
        shown = pattern if len(pattern) <= 120 else pattern[:117] + "..."
        super().__init__(
            f"the pattern /{shown}/ found no answer within {budget_s:g} s on a message of {chars:,} characters: "
            "it backtracks without end (a runaway pattern)"
        )


_engine: list[ModuleType | None] = []


def _regex() -> ModuleType | None:
    """The ``regex`` package, where installed (imported once, when first needed)."""
    if not _engine:
        try:
            import regex
        except ImportError:
            _engine.append(None)
        else:
            _engine.append(regex)
    return _engine[0]


class _Expired(Exception):
    pass


def _expire(signum: int, frame: FrameType | None) -> None:
    raise _Expired


def _search_timed(pattern: str, text: str, budget_s: float) -> bool:
    """``re.search`` on the main thread, stopped by SIGALRM after ``budget_s`` (the timer and the
    handler before it are put back)."""
    before = signal.signal(signal.SIGALRM, _expire)
    earlier = signal.setitimer(signal.ITIMER_REAL, budget_s)
    try:
        return re.search(pattern, text, flags=re.MULTILINE) is not None
    except _Expired:
        raise PatternRunaway(pattern, len(text), budget_s) from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before if before is not None else signal.SIG_DFL)
        if earlier[0] > 0:
            signal.setitimer(signal.ITIMER_REAL, *earlier)


def search(pattern: str, text: str, budget_s: float = BUDGET_S) -> bool:
    """Whether ``pattern`` (``re`` syntax, multi-line) is found in ``text``; ``PatternRunaway`` where
    the search runs past ``budget_s``."""
    engine = _regex()
    if engine is not None:
        try:
            return engine.search(pattern, text, flags=engine.MULTILINE | engine.V0, timeout=budget_s) is not None
        except TimeoutError:
            raise PatternRunaway(pattern, len(text), budget_s) from None
        except engine.error:
            pass  # a pattern only ``re`` reads the same way: searched with it, below
    if threading.current_thread() is threading.main_thread():
        return _search_timed(pattern, text, budget_s)
    return re.search(pattern, text, flags=re.MULTILINE) is not None
