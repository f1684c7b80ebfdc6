"""Find and kill every process an item started, wherever it went.

torchrun starts each rank in a session of its own, so killing torchrun's process
group does not reach the ranks, nor their children; and once torchrun is dead its
descendants are re-parented and the tree is gone. What survives all of that is the
environment: every process an item starts inherits a token variable, and the sweep
kills each process that carries it. Ranks forked by a cell's pre-imported worker keep
the worker's original environment block (``/proc/PID/environ`` is what was exec'd),
so for those the sweep also kills every process left in the item leader's session.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

TOKEN_VARIABLE = "FT_REGRESS_ITEM_TOKEN"


def live_processes() -> Iterator[tuple[int, list[str]]]:
    """Every live (not zombie) process but this one: its pid and the fields of its ``stat``
    after the command name (state, ppid, pgrp, session, ...)."""
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError):
            continue
        if fields and fields[0] != "Z":
            yield int(entry.name), fields


def processes_with_token(token: str) -> list[int]:
    needle = f"{TOKEN_VARIABLE}={token}".encode()
    found = []
    for pid, _ in live_processes():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if needle in environ.split(b"\0"):
            found.append(pid)
    return found


def processes_in_session(session_id: int) -> list[int]:
    """Live processes whose session is ``session_id`` (field 6 of ``/proc/PID/stat``)."""
    return [pid for pid, fields in live_processes() if int(fields[3]) == session_id]


def _kill_until_gone(find: Callable[[], list[int]], rounds: int) -> list[int]:
    """SIGKILL what ``find`` returns until it returns nothing; return the pids killed."""
    killed: list[int] = []
    for _ in range(rounds):
        pids = find()
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.1)
    return sorted(set(killed))


def sweep(token: str, rounds: int = 5) -> list[int]:
    """SIGKILL every live process carrying ``token``; return the pids killed."""
    return _kill_until_gone(lambda: processes_with_token(token), rounds)


def sweep_session(session_id: int, rounds: int = 5) -> list[int]:
    """SIGKILL every live process still in session ``session_id``; return the pids killed."""
    return _kill_until_gone(lambda: processes_in_session(session_id), rounds)
