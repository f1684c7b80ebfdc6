"""What ``--as-of`` names: a day (``2026-11-27``: released before that day) or a UTC time
(``2026-11-27T07:20:31Z``: released before that second), the form a floating run's rerun
commands take, so that they resolve what the run resolved."""

from __future__ import annotations

import datetime as dt


def as_of_value(text: str) -> str:
    """``text`` as one canonical form: a day as ``YYYY-MM-DD``; a time with its zone (``Z`` or an
    offset) as UTC ``YYYY-MM-DDTHH:MM:SSZ``. ValueError for anything else, a time without a zone
    included (whose day it was would depend on the machine)."""
    if "T" not in text and " " not in text:
        return dt.date.fromisoformat(text).isoformat()
    moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone")
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def as_of_day(as_of: str) -> dt.date:
    """The day of an ``--as-of`` value (a time's UTC day)."""
    return dt.date.fromisoformat(as_of_value(as_of)[:10])
