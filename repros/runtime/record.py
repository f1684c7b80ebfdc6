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
import stat
from pathlib import Path
from typing import Any

RECORD_VERSION = 1


def rank_record_path(item_dir: Path, rank: int) -> Path:
    return item_dir / f"rank{rank}.json"


def rank_log_path(item_dir: Path, rank: int) -> Path:
    return item_dir / f"rank{rank}.log"


def log_pipe_path(log_path: Path) -> Path:
    """Where the orchestrator listens for what is written to ``log_path`` (a named pipe it copies
    into ``log_path``, capped); absent when nobody listens (the log is then written directly)."""
    return log_path.with_name(f".{log_path.name}.pipe")


def log_of_pipe(path: Path) -> Path | None:
    """The log a pipe of ``log_pipe_path`` is copied into (what a rank's stdout, a pipe, stands
    for), or None where ``path`` is not such a pipe."""
    name = path.name
    if name.startswith(".") and name.endswith(".pipe") and len(name) > len("..pipe"):
        return path.with_name(name[1 : -len(".pipe")])
    return None


def open_log(log_path: Path) -> int:
    """A descriptor to write ``log_path`` through: the orchestrator's pipe for it where one is
    listening, else the file itself (appended)."""
    pipe = log_pipe_path(log_path)
    try:
        if stat.S_ISFIFO(os.stat(pipe).st_mode):
            # Non-blocking only to fail at once (ENXIO) where nobody reads; writes then block.
            fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
            os.set_blocking(fd, True)
            return fd
    except OSError:
        pass
    return os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def write_rank_record(item_dir: Path, rank: int, record: dict[str, Any]) -> None:
    path = rank_record_path(item_dir, rank)
    tmp = path.with_suffix(f".json.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"record_version": RECORD_VERSION, **record}, fh, default=str)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _whole(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def ran_as() -> dict[str, Any]:
    """Who the rank was as it ended, as its own code saw it: its rank, local rank and world size in
    the variables torchrun sets (which a repro's settings, a script's ``env:``, may have changed),
    and from its process group where one is still set up (what collectives ran with). The
    orchestrator records this, not what it launched, where they differ."""
    import sys

    seen: dict[str, Any] = {
        "rank": _whole(os.environ.get("RANK")),
        "local_rank": _whole(os.environ.get("LOCAL_RANK")),
        "world_size": _whole(os.environ.get("WORLD_SIZE")),
        "source": "environment",
    }
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            seen.update(rank=int(dist.get_rank()), world_size=int(dist.get_world_size()), source="process group")
    except Exception:  # noqa: BLE001 - a group being torn down: the variables say it
        pass
    return seen


class ScenarioUnavailable(Exception):
    """Raised by a repro when its scenario cannot run in this cell at all (a missing
    device, a library that lacks the feature). The outcome is ``INFRA``, never a
    reproduction or a different error."""
