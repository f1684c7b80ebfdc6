"""What a killed run left behind, found and removed by the next run (or ``--resume``).

Every process an item starts carries its orchestrator's marker (``pid:start``) in its
environment; a process whose orchestrator is no longer alive is an orphan of a killed run and
is killed. DeepSpeed's shared-memory segments that no live process maps any more, and that are
older than a minute, are removed (a killed run never reached its own ``/dev/shm`` sweep). Item
cgroups of dead orchestrators are killed and removed (``harness/execution/containment/cgroups.py``).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.execution.containment import cgroups
from harness.execution.containment.processes import live_processes
from harness.execution.containment.shm import DEEPSPEED_PREFIX, SHM_DIR
from repros.runtime.lifeline import ORCHESTRATOR_VARIABLE, marker_alive

#: A segment younger than this may belong to an item starting right now.
SHM_GRACE_S = 60.0


@dataclass
class Swept:
    processes: list[int] = field(default_factory=list)
    shm_segments: list[str] = field(default_factory=list)
    cgroups: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.processes or self.shm_segments or self.cgroups)

    def as_record(self) -> dict[str, list]:
        return {"processes": self.processes, "shm_segments": self.shm_segments, "cgroups": self.cgroups}


def orphans() -> list[int]:
    """Live processes that belong to an orchestrator that is no longer alive."""
    needle = f"{ORCHESTRATOR_VARIABLE}=".encode()
    found = []
    for pid, _ in live_processes():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        for entry in environ.split(b"\0"):
            if entry.startswith(needle):
                if not marker_alive(entry[len(needle) :].decode(errors="replace")):
                    found.append(pid)
                break
    return found


def _mapped_segments() -> set[str]:
    mapped: set[str] = set()
    prefix = f"{SHM_DIR}/{DEEPSPEED_PREFIX}"
    for pid, _ in live_processes():
        try:
            with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    if prefix in line:
                        mapped.add(line.rsplit(None, 1)[-1].rsplit("/", 1)[-1])
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return mapped


def stale_segments(shm_dir: Path = SHM_DIR, grace_s: float = SHM_GRACE_S) -> list[Path]:
    try:
        candidates = [p for p in shm_dir.iterdir() if p.name.startswith(DEEPSPEED_PREFIX)]
    except OSError:
        return []
    if not candidates:
        return []
    mapped = _mapped_segments()
    now = time.time()
    stale = []
    for path in candidates:
        try:
            age = now - path.stat().st_mtime
        except FileNotFoundError:
            continue
        if path.name not in mapped and age > grace_s:
            stale.append(path)
    return stale


def sweep_dead_runs(shm_dir: Path = SHM_DIR) -> Swept:
    """Kill the orphans of dead runs and remove what they left in /dev/shm and the cgroups."""
    swept = Swept()
    for _ in range(5):
        pids = orphans()
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                swept.processes.append(pid)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.1)
    swept.cgroups = cgroups.remove_dead()
    for path in stale_segments(shm_dir):
        try:
            path.unlink()
            swept.shm_segments.append(path.name)
        except FileNotFoundError:
            pass
    swept.processes = sorted(set(swept.processes))
    return swept
