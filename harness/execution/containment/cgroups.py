"""A cgroup per item, where this machine lets the orchestrator make them (cgroup v2, writable).

The token and session sweeps find an item's processes by their environment and their session;
a process that clears its environment and starts a session of its own (a daemon, a double fork)
escapes both. cgroup membership is inherited by every child and cannot be left by changing
either, so each item's first process joins a cgroup of its own, and after the item every process
still in it is killed (``cgroup.kill``) before the cgroup is removed. Where no writable cgroup v2
hierarchy exists (an unprivileged user, a cgroup v1-only host), items run without one and the
sweeps are what remains; ``run.json`` says which (``isolation``).

Layout: ``<cgroup2 mount>/<this process's cgroup>/ft-regress/<orchestrator pid>-<start>/item-<token>``.
A later run removes the item cgroups of orchestrators that are no longer alive.
"""

from __future__ import annotations

import atexit
import functools
import os
import signal
import time
from pathlib import Path

from repros.runtime.lifeline import marker_alive

BASE_NAME = "ft-regress"


def _cgroup2_mount() -> Path | None:
    try:
        with open("/proc/self/mounts", encoding="utf-8") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 3 and parts[2] == "cgroup2":
                    return Path(parts[1])
    except OSError:
        return None
    return None


def _own_cgroup() -> str:
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return line[3:].strip()
    except OSError:
        pass
    return "/"


@functools.lru_cache(maxsize=1)
def base() -> tuple[Path | None, str]:
    """Where item cgroups go, or None and why there are none here."""
    mount = _cgroup2_mount()
    if mount is None:
        return None, "no cgroup v2 hierarchy is mounted"
    root = mount / _own_cgroup().lstrip("/") / BASE_NAME
    probe = root / f"probe-{os.getpid()}"
    try:
        probe.mkdir(parents=True, exist_ok=True)
        (probe / "cgroup.procs").read_text()
        probe.rmdir()
    except OSError as exc:
        return None, f"cgroup v2 at {mount} is not writable here ({exc.strerror})"
    return root, f"a cgroup v2 per item under {root}"


def describe() -> str:
    return base()[1]


def _orchestrator_dir(marker: str) -> Path | None:
    root, _ = base()
    return None if root is None else root / marker.replace(":", "-")


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class ItemCgroup:
    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, orchestrator: str, token: str) -> ItemCgroup | None:
        parent = _orchestrator_dir(orchestrator)
        if parent is None:
            return None
        path = parent / f"item-{token}"
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError:
            return None
        _remove_at_exit(parent)
        return cls(path)

    @property
    def procs_file(self) -> Path:
        return self.path / "cgroup.procs"

    def pids(self) -> list[int]:
        """The live processes in the cgroup (a zombie is dead already, waiting to be reaped)."""
        try:
            listed = [int(p) for p in self.procs_file.read_text().split()]
        except (OSError, ValueError):
            return []
        return [pid for pid in listed if _alive(pid)]

    def kill_all(self, wait_s: float = 5.0) -> list[int]:
        """SIGKILL every process in the cgroup (and what it forks meanwhile); return the pids seen."""
        killed: set[int] = set()
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            pids = self.pids()
            if not pids:
                break
            killed.update(pids)
            try:
                (self.path / "cgroup.kill").write_text("1")
            except OSError:
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
            time.sleep(0.05)
        return sorted(killed)

    def remove(self) -> None:
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.05)  # the last killed processes are still being reaped


@functools.cache
def _remove_at_exit(parent: Path) -> None:
    """This orchestrator's own directory goes when it exits (its item cgroups are gone by then)."""

    def remove() -> None:
        try:
            parent.rmdir()
        except OSError:
            pass  # an item cgroup is still there: the next run's remove_dead takes it

    atexit.register(remove)


def _command(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:200] or "?"


def remove_dead() -> dict[str, tuple[str, dict[int, str]]]:
    """Kill and remove the item cgroups of orchestrators that are no longer alive: each cgroup's
    path → its orchestrator (``pid:start``) and the processes killed in it (pid → command line)."""
    root, _ = base()
    removed: dict[str, tuple[str, dict[int, str]]] = {}
    if root is None or not root.is_dir():
        return removed
    for orchestrator in root.iterdir():
        if not orchestrator.is_dir() or orchestrator.name.startswith("probe-"):
            continue
        marker = orchestrator.name.replace("-", ":", 1)
        if marker_alive(marker):
            continue
        for item in orchestrator.iterdir():
            if item.is_dir():
                group = ItemCgroup(item)
                commands = {pid: _command(pid) for pid in group.pids()}
                killed = group.kill_all()
                group.remove()
                removed[str(item)] = (marker, {pid: commands.get(pid, "?") for pid in killed})
        try:
            orchestrator.rmdir()
        except OSError:
            pass
    return removed
