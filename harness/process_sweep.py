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
from pathlib import Path

TOKEN_VARIABLE = "FT_REGRESS_ITEM_TOKEN"


def processes_with_token(token: str) -> list[int]:
    needle = f"{TOKEN_VARIABLE}={token}".encode()
    found = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError):
            continue
        if state != "Z" and needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def sweep(token: str, rounds: int = 5) -> list[int]:
    """SIGKILL every live process carrying ``token``; return the pids killed."""
    killed: list[int] = []
    for _ in range(rounds):
        pids = processes_with_token(token)
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


def processes_in_session(session_id: int) -> list[int]:
    """Live processes whose session is ``session_id`` (field 6 of ``/proc/PID/stat``)."""
    found = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[3]) == session_id:
            found.append(int(entry.name))
    return found


def sweep_session(session_id: int, rounds: int = 5) -> list[int]:
    """SIGKILL every live process still in session ``session_id``; return the pids killed."""
    killed: list[int] = []
    for _ in range(rounds):
        pids = processes_in_session(session_id)
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
