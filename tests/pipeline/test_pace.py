"""Where a long run stands, in a log that has no live progress bar: items done of the total, the rate
so far, and when the rest should be done at that rate."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from harness.reports.progress import pace_text


def test_the_pace_says_done_of_total_the_rate_and_the_time_left() -> None:
    assert pace_text(30, 120, 600.0) == "30/120 · 3.0 items/min · ETA 30m00s"
    assert pace_text(1, 2, 10.0) == "1/2 · 6.0 items/min · ETA 10s"
    assert pace_text(100, 10_000, 60.0) == "100/10000 · 100.0 items/min · ETA 1h39m"
    assert pace_text(0, 10, 5.0) == "0/10"


@given(done=st.integers(1, 10**6), extra=st.integers(0, 10**6), elapsed=st.floats(0.001, 1e7))
def test_the_pace_always_reads_as_one_short_line(done: int, extra: int, elapsed: float) -> None:
    text = pace_text(done, done + extra, elapsed)
    assert text.startswith(f"{done}/{done + extra} · ") and "\n" not in text and "ETA " in text
