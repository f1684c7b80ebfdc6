"""The signals that stop a run: Ctrl-C, and SIGTERM or SIGHUP (``kill``, a cancelled CI job, a
closed terminal) stop it like Ctrl-C does, keeping what finished.

``stop_signals`` makes them the run's for its span and puts the previous handlers back after: a
run started with SIGINT ignored (a background job of a non-interactive shell) is still
interruptible, and one started under ``nohup`` keeps SIGHUP ignored, as it asked.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager

#: The signals that stop a run like Ctrl-C: ``kill``, a CI job cancelled, a terminal closed.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class RunInterrupted(Exception):
    """SIGTERM or SIGHUP arrived: stop like on Ctrl-C, keeping what finished. ``str()``: the signal's name."""


@contextmanager
def stop_signals(on_hangup: Callable[[], None]) -> Iterator[None]:
    """For the span: SIGTERM and SIGHUP raise ``RunInterrupted``, SIGINT ``KeyboardInterrupt``.
    ``on_hangup`` runs first on SIGHUP (the terminal is gone: stop writing to it)."""

    def stop(signum: int, frame: object) -> None:
        if signum == signal.SIGHUP:
            on_hangup()
        raise RunInterrupted(signal.Signals(signum).name)

    previous = {
        signum: signal.signal(signum, stop)
        for signum in STOP_SIGNALS
        # A run started under ``nohup`` asked to outlive its terminal: SIGHUP stays ignored.
        if not (signum == signal.SIGHUP and signal.getsignal(signum) == signal.SIG_IGN)
    }
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        signal.signal(signal.SIGINT, previous_int)
