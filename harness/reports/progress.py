"""What a run says while it runs: one line per finished item (``progress_line``), a live bar on a
terminal, and where a long run stands every ``PACE_EVERY_ITEMS`` items or ``PACE_EVERY_S`` seconds
for a log that has no live bar (``pace_text``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from harness.core.text import plain
from harness.records.item import ItemRecord, counts_text

#: A run of at least this many items says where it stands every ``PACE_EVERY_ITEMS`` items or
#: ``PACE_EVERY_S`` seconds, whichever comes first.
PACE_MIN_ITEMS = 10
PACE_EVERY_ITEMS = 10
PACE_EVERY_S = 60.0
#: A long step (an environment's build) says it is still under way this often.
STILL_EVERY_S = 30.0


def progress_line(record: ItemRecord) -> str:
    """One line per finished item: outcome against expectation, time, and the error."""
    if record.matched:
        mark, against = "✓", f"expected {record.expected}"
        if record.flaky and record.attempts:
            first = record.attempts[0].outcome
            against += f"; flaky: {first} first, matched on attempt {len(record.attempts) + 1}"
    elif record.is_finding:
        mark, against = "·", "explored" + (f", expected {record.expected}" if record.expected else "")
    elif record.expected is None:
        # Variants and grid combinations carry no expectation: what they observe is the finding.
        mark, against = "·", "no expectation"
    else:
        mark, against = "✗", f"expected {record.expected}"
    line = f"{mark} {record.id.label()}: {record.outcome} ({against}) {record.wall_s:.1f}s"
    if record.outcome_counts:
        line += f" [{counts_text(record.outcome_counts)} of {record.repeat}]"
    error = record.error
    if error:
        message = error.message
        line += f" - {error.type}: {message[:160]}{'…' if len(message) > 160 else ''}"
    elif record.reasons:
        line += f" - {record.reasons[0].splitlines()[0][:160] if record.reasons[0] else ''}"
    return plain(line)


def pace_text(done: int, total: int, elapsed_s: float) -> str:
    """Where a long run stands, for a log without the live bar: items done of the total, the rate so
    far, and when the rest should be done at that rate."""
    if done <= 0 or elapsed_s <= 0:
        return f"{done}/{total}"
    per_minute = 60 * done / elapsed_s
    left = max(total - done, 0)
    eta = left / per_minute * 60 if per_minute else 0.0
    return f"{done}/{total} · {per_minute:.1f} items/min · ETA {_duration(eta)}"


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


@contextmanager
def still_under_way(say: Callable[[str], None], what: str, every_s: float = STILL_EVERY_S) -> Iterator[None]:
    """While the block runs, say every ``every_s`` seconds that ``what`` is still under way and for how
    long (a build of minutes is never silent)."""
    done = threading.Event()
    started = time.monotonic()

    def tell() -> None:
        while not done.wait(every_s):
            say(f"  ... {what}: {_duration(time.monotonic() - started)} so far")

    teller = threading.Thread(target=tell, name="still-under-way", daemon=True)
    teller.start()
    try:
        yield
    finally:
        done.set()
        teller.join()


class RunProgress:
    """A run's items as they finish, on ``console``: the live bar (gone once the run ends), a line
    per item, the pace of a long run. A context manager, for the span of the items."""

    def __init__(self, console: Console, total: int) -> None:
        self.console = console
        self.total = total
        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=True,
        )
        self._task = self._bar.add_task("items", total=total)
        self._started = time.monotonic()
        self._said = self._started
        self._done = 0

    def __enter__(self) -> RunProgress:
        self._bar.__enter__()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._bar.__exit__(kind, error, trace)

    def say(self, text: str) -> None:
        self.console.print(plain(text), highlight=False, markup=False)

    def doing(self, text: str) -> None:
        """What the run is busy with, beside the bar (a cell's environment, items in flight)."""
        self._bar.update(self._task, description=text)

    def running(self, count: int) -> None:
        if count:
            self.doing(f"{count} items queued or running")

    def finished(self, record: ItemRecord) -> None:
        """An item's record is written: its line, and every tenth item, or a minute after the last
        word, where the run stands."""
        self._bar.advance(self._task)
        self.say(progress_line(record))
        self._done += 1
        now_s = time.monotonic()
        if (
            self.total >= PACE_MIN_ITEMS
            and self._done < self.total
            and (self._done % PACE_EVERY_ITEMS == 0 or now_s - self._said >= PACE_EVERY_S)
        ):
            self._said = now_s
            self.say(f"progress: {pace_text(self._done, self.total, now_s - self._started)}")
