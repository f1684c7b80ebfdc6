"""``--as-of`` names a day or a UTC time: uv cuts off at the day's first second or at the time."""

from __future__ import annotations

import argparse
import datetime as dt

import pytest

from harness.core.as_of import as_of_day, as_of_value
from harness.core.option import past_as_of
from harness.environments.locks import cutoff


def test_a_day_cuts_off_at_its_first_second_and_a_time_at_itself() -> None:
    assert cutoff("2025-03-25") == "2025-03-25T00:00:00Z"
    assert cutoff("2026-11-26T21:04:05Z") == "2026-11-26T21:04:05Z"
    # An offset is the same moment in UTC, and its UTC day is the day.
    assert cutoff("2026-11-27T01:04:05+04:00") == "2026-11-26T21:04:05Z"
    assert as_of_day("2026-11-27T01:04:05+04:00") == dt.date(2026, 11, 26)


def test_the_option_refuses_a_time_without_a_zone_a_future_day_and_nonsense() -> None:
    parse = past_as_of("--as-of")
    assert parse("2026-11-26T21:04:05+00:00") == "2026-11-26T21:04:05Z"
    for bad in ("2026-11-26T21:04:05", "yesterday", "2026-13-01"):
        with pytest.raises(argparse.ArgumentTypeError, match="YYYY-MM-DD"):
            parse(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="in the future"):
        parse(str(dt.date.today() + dt.timedelta(days=2)))
    with pytest.raises(ValueError):
        as_of_value("2026-11-26 21:04")
