"""The per-rank JSON record a worker writes. Standard library only.

A rank writes its record when it starts (``status: running``) and rewrites it when
it ends (``ok``, ``error`` or ``unavailable``). A record still ``running`` after the
launch ended means the rank died without reaching its own exception handler.
The write is atomic (temporary file, then rename), so the orchestrator never reads
half a record.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

RECORD_VERSION = 1


def rank_record_path(item_dir: Path, rank: int) -> Path:
    return item_dir / f"rank{rank}.json"


def rank_log_path(item_dir: Path, rank: int) -> Path:
    return item_dir / f"rank{rank}.log"


def write_rank_record(item_dir: Path, rank: int, record: dict[str, Any]) -> None:
    path = rank_record_path(item_dir, rank)
    tmp = path.with_suffix(f".json.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"record_version": RECORD_VERSION, **record}, fh, default=str)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class ScenarioUnavailable(Exception):
    """Raised by a repro when its scenario cannot run in this cell at all (a missing
    device, a library that lacks the feature). The outcome is ``INFRA``, never a
    reproduction or a different error."""
