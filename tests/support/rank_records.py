"""Builders for what ranks record and what a launch returns, for tests that classify
recorded failure texts without launching anything."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.execution.launchers.result import LaunchResult
from harness.records.rank import RankRecord, parse_rank_record


def rank_record(rank: int, status: str = "ok", **fields: Any) -> RankRecord:
    """What a rank records, validated as the orchestrator reads it back."""
    return parse_rank_record({"rank": rank, "status": status, **fields})


def error_record(
    rank: int, etype: str, message: str, *, phase: str = "run", facts: Mapping[str, Any] | None = None
) -> RankRecord:
    """A rank that raised ``etype: message`` (with the scenario facts it recorded, if any)."""
    recorded = {"facts": {"scenario_facts": dict(facts)}} if facts is not None else {}
    return rank_record(
        rank, "error", phase=phase, error={"type": etype, "message": message, "traceback": ""}, **recorded
    )


def failed_launch(records: dict[int, RankRecord | None], exitcodes: dict[int, int] | None = None) -> LaunchResult:
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
