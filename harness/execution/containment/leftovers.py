"""What a killed run left behind, found and removed by the next run (or ``--resume``), and said.

A run killed outright (SIGKILL, the OOM killer) never reaches its own sweeps. Its items'
lifelines and leaders kill what the items started as soon as they see it gone
(``repros/runtime/lifeline.py``); what remains is found here, at the start of the next run:

* processes: every process an item starts carries its orchestrator's marker (``pid:start``) in
  its environment; one whose orchestrator is no longer alive is killed, its descendants first
  (a dead item's reaper may not have looked yet: the daemons it adopted carry no marker). Item cgroups of dead
  orchestrators are killed and removed (``cgroups.py``), and the processes they held are named;
* shared memory: each orchestrator notes the items it has in flight (``in_flight_item``: the
  item's directory, under ``LEDGER_DIR/<orchestrator>``). The items of a dead orchestrator are
  read back, and DeepSpeed's ``/dev/shm`` segments named after their rendezvous are removed at
  once, unless a live process maps them (a port the dead item had may be a live item's now).
  Segments of no known item, no live process maps and older than a minute go too.

``Swept.describe`` says precisely what was cleaned (each process with its command line, each
segment, each cgroup, and which dead runs they were), and ``run.json`` keeps it.
"""

from __future__ import annotations

import os
import signal
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from harness.execution.containment import cgroups
from harness.execution.containment.processes import live_processes
from harness.execution.containment.shm import DEEPSPEED_PREFIX, SHM_DIR, item_segments, rendezvous_points
from harness.records.rank import read_rank_record
from repros.runtime.lifeline import (
    ORCHESTRATOR_VARIABLE,
    descendants,
    kill_descendants,
    marker_alive,
    orchestrator_marker,
)
from repros.runtime.record import rank_record_path

#: A segment of no known item younger than this may belong to an item starting right now.
SHM_GRACE_S = 60.0
#: Where each orchestrator notes its items in flight: ``<orchestrator>/<token>`` holds an item's directory.
LEDGER_DIR = Path(tempfile.gettempdir()) / f"ft-regress-{os.getuid()}" / "in-flight"
#: How many ranks' records of a dead item are looked for (the ledger does not keep the world size).
MAX_RANKS = 1024


@dataclass
class Swept:
    processes: list[int] = field(default_factory=list)
    shm_segments: list[str] = field(default_factory=list)
    cgroups: list[str] = field(default_factory=list)
    #: The dead runs (their orchestrators, ``pid:start``) whose leftovers were found.
    runs: list[str] = field(default_factory=list)
    #: Each killed process's command line, by pid.
    commands: dict[int, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.processes or self.shm_segments or self.cgroups)

    def as_record(self) -> dict[str, object]:
        return {
            "processes": self.processes,
            "shm_segments": self.shm_segments,
            "cgroups": self.cgroups,
            "runs": self.runs,
            "commands": {str(pid): cmd for pid, cmd in sorted(self.commands.items())},
        }

    def describe(self) -> str:
        """One line: what was cleaned, precisely, and whose it was."""
        parts = []
        if self.processes:
            shown = "; ".join(f"{pid} {self.commands.get(pid, '?')}" for pid in self.processes)
            parts.append(f"killed {len(self.processes)} process(es) ({shown})")
        if self.shm_segments:
            parts.append(f"removed {len(self.shm_segments)} /dev/shm segment(s) ({', '.join(self.shm_segments)})")
        if self.cgroups:
            parts.append(f"removed {len(self.cgroups)} cgroup(s) ({', '.join(self.cgroups)})")
        whose = f"killed run(s) {', '.join(self.runs)}" if self.runs else "a killed run"
        return f"cleaned up after {whose}: " + "; ".join(parts) if parts else f"nothing left by {whose}"


def _command(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:200] or "?"


def _marker_of(pid: int) -> str | None:
    needle = f"{ORCHESTRATOR_VARIABLE}=".encode()
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    for entry in environ.split(b"\0"):
        if entry.startswith(needle):
            return entry[len(needle) :].decode(errors="replace")
    return None


def orphans() -> dict[int, str]:
    """Live processes that belong to an orchestrator that is no longer alive: pid → its marker."""
    found: dict[int, str] = {}
    for pid, _ in live_processes():
        marker = _marker_of(pid)
        if marker is not None and not marker_alive(marker):
            found[pid] = marker
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


# -- the ledger of items in flight ---------------------------------------------------------------
def _ledger_of(marker: str, ledger: Path) -> Path:
    return ledger / marker.replace(":", "-")


@contextmanager
def in_flight_item(token: str, item_dir: Path, ledger: Path | None = None) -> Iterator[None]:
    """Note the item as in flight for as long as it runs: if this run is killed, the next one
    finds the item's directory here, and what the item left in /dev/shm by it."""
    entry = _ledger_of(orchestrator_marker(), ledger or LEDGER_DIR) / token
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        entry.write_text(str(item_dir))
    except OSError:
        pass  # a run that cannot note its items still runs them; a dead one's segments age out
    try:
        yield
    finally:
        entry.unlink(missing_ok=True)
        try:
            entry.parent.rmdir()
        except OSError:
            pass  # other items of this run are still in flight


def dead_items(ledger: Path | None = None) -> dict[str, list[Path]]:
    """The items dead orchestrators had in flight: their markers → the items' directories."""
    found: dict[str, list[Path]] = {}
    try:
        runs = list((ledger or LEDGER_DIR).iterdir())
    except OSError:
        return found
    for run in runs:
        marker = run.name.replace("-", ":", 1)
        if marker_alive(marker):
            continue
        items = []
        for entry in run.iterdir() if run.is_dir() else []:
            try:
                items.append(Path(entry.read_text().strip()))
            except OSError:
                continue
        found[marker] = items
    return found


def _forget(marker: str, ledger: Path) -> None:
    run = _ledger_of(marker, ledger)
    for entry in run.iterdir() if run.is_dir() else []:
        entry.unlink(missing_ok=True)
    try:
        run.rmdir()
    except OSError:
        pass


def _item_rendezvous(item_dir: Path) -> set[tuple[str, str]]:
    records = []
    for rank in range(MAX_RANKS):
        path = rank_record_path(item_dir, rank)
        if not path.exists():
            break
        records.append(read_rank_record(path))
    return rendezvous_points(records)


def _kill_tree(pid: int) -> dict[int, str]:
    """Kill ``pid`` and its descendants first: a dead item's reaper (a lifeline, an item leader, a
    cell's worker) holds the daemons it adopted, which carry no marker and would go to init with
    it. A tree that holds this process or a live run's (a run started from inside a dead one's
    item) loses only ``pid``. Return each killed process's command line, read before it died."""
    try:
        os.kill(pid, signal.SIGSTOP)  # no new children while its tree is killed
    except (ProcessLookupError, PermissionError):
        return {}
    tree = descendants(pid)
    live_run_inside = os.getpid() in tree or any(marker_alive(m) for m in map(_marker_of, tree) if m is not None)
    commands = {p: _command(p) for p in [pid, *tree]}
    killed = [] if live_run_inside else kill_descendants(pid)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return {p: commands.get(p) or _command(p) for p in [pid, *killed]}


def _kill(pids: dict[int, str], swept: Swept) -> None:
    for pid, marker in pids.items():
        for killed, command in _kill_tree(pid).items():
            if killed not in swept.commands:
                swept.processes.append(killed)
                swept.commands[killed] = command
        if marker and marker not in swept.runs:
            swept.runs.append(marker)


def sweep_dead_runs(shm_dir: Path = SHM_DIR, ledger: Path | None = None) -> Swept:
    """Kill the orphans of dead runs and remove what they left in /dev/shm and the cgroups."""
    swept = Swept()
    for _ in range(5):
        pids = orphans()
        if not pids:
            break
        _kill(pids, swept)
        time.sleep(0.1)
    for group, (marker, killed) in cgroups.remove_dead().items():
        swept.cgroups.append(group)
        for pid, command in killed.items():
            if pid not in swept.commands:
                swept.processes.append(pid)
                swept.commands[pid] = command
        if marker not in swept.runs:
            swept.runs.append(marker)
    # The dead runs' items: their segments by name, whatever their age.
    mapped = _mapped_segments()
    for marker, items in dead_items(ledger).items():
        for item_dir in items:
            for addr, port in sorted(_item_rendezvous(item_dir)):
                for segment in item_segments(addr, port, shm_dir):
                    if segment.name in mapped:
                        continue  # the port is a live item's now
                    try:
                        segment.unlink()
                    except OSError:
                        continue
                    swept.shm_segments.append(segment.name)
                    if marker not in swept.runs:
                        swept.runs.append(marker)
        _forget(marker, ledger or LEDGER_DIR)
    for path in stale_segments(shm_dir):
        try:
            path.unlink()
            swept.shm_segments.append(path.name)
        except FileNotFoundError:
            pass
    swept.processes = sorted(set(swept.processes))
    return swept
