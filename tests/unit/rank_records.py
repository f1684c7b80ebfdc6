"""Builders for what ranks record and what a launch returns, for tests that classify
recorded failure texts without launching anything."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.launchers.result import LaunchResult


def error_record(
    rank: int, etype: str, message: str, *, phase: str = "run", facts: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A rank that raised ``etype: message`` (with the scenario facts it recorded, if any)."""
    record: dict[str, Any] = {
        "rank": rank,
        "status": "error",
        "phase": phase,
        "error": {"type": etype, "message": message, "traceback": ""},
    }
    if facts is not None:
        record["scenario_facts"] = dict(facts)
    return record


def failed_launch(records: dict[int, dict[str, Any] | None], exitcodes: dict[int, int] | None = None) -> LaunchResult:
    """A launch whose ranks left ``records`` (``None``: a rank that wrote nothing) and torchrun exited 1."""
    return LaunchResult(
        command=["torchrun"],
        returncode=1,
        timed_out=False,
        wall_s=1.0,
        world_size=len(records),
        records=records,
        rank_exitcodes=exitcodes or {},
    )
