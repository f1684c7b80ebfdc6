"""Die with the orchestrator, and take everything the item started along: what keeps an item's
processes from outliving the item, or a killed run.

Standard library only. ``die_with_parent`` asks the kernel to SIGKILL this process when its
parent ends (Linux ``PR_SET_PDEATHSIG``), and checks the parent is still the one it was
started by (it may have died before the request was made). A process started with
``ORCHESTRATOR_VARIABLE`` in its environment belongs to that orchestrator (``pid:start``), so
a later run can find and stop what a killed run left behind.

Containment without a cgroup: an item's first process (this lifeline under torchrun, the item
leader under a cell's worker) is a *child subreaper* (``PR_SET_CHILD_SUBREAPER``): a process of
the item whose parent dies (a daemon's double fork, ``setsid`` and all) is re-parented to it,
never to init, so every process the item started stays its descendant. The item ends with
``kill_descendants`` (each still-living descendant stopped, then killed, until none is left),
the reaper last; a reaper whose orchestrator dies does the same before it goes.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from collections.abc import Iterable

ORCHESTRATOR_VARIABLE = "FT_REGRESS_ORCHESTRATOR"
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(option, value, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def die_with_parent(expected_parent: int | None = None) -> bool:
    """SIGKILL this process when its parent ends; False where the kernel cannot do it.
    Exits at once if the parent is already gone (``expected_parent`` no longer its parent)."""
    if not _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL)):
        return False
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(70)  # the parent died before the request was made
    return True


def become_subreaper() -> bool:
    """Orphans among this process's descendants are re-parented to it (not to init); False where
    the kernel cannot do it (not Linux)."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def process_start_time(pid: int) -> str | None:
    """The start time of ``pid`` in clock ticks since boot (field 22 of /proc/PID/stat)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def orchestrator_marker(pid: int | None = None) -> str:
    """``pid:start``: names one process for as long as the machine runs (pids are reused)."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}:{process_start_time(pid) or '?'}"


def marker_alive(marker: str) -> bool:
    pid, _, start = marker.partition(":")
    try:
        return process_start_time(int(pid)) == start
    except ValueError:
        return False


def _parents() -> dict[int, int]:
    """Every live (not zombie) process's parent, by pid."""
    found: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields and fields[0] not in ("Z", "X"):
            found[int(name)] = int(fields[1])
    return found


def children(parent: int) -> list[int]:
    """The live children of ``parent``."""
    return [pid for pid, ppid in _parents().items() if ppid == parent]


def descendants(root: int) -> list[int]:
    """The live descendants of ``root`` (not ``root`` itself), parents before their children."""
    children: dict[int, list[int]] = {}
    for pid, parent in _parents().items():
        children.setdefault(parent, []).append(pid)
    found: list[int] = []
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop(0)
        if pid == root or pid in found:
            continue
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def _signal_all(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def reap_children() -> None:
    """Collect the exit status of every child that has ended (a reaper's adopted orphans)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_descendants(root: int | None = None, rounds: int = 50, reap: bool = False) -> list[int]:
    """Stop, then SIGKILL, every live descendant of ``root`` (this process by default), round
    after round until none is left (a killed parent's orphans come back to a subreaper ``root``);
    ``reap``: ``root`` is this process, which collects them. Return the pids killed."""
    root = os.getpid() if root is None else root
    killed: list[int] = []
    for _ in range(rounds):
        found = descendants(root)
        if not found:
            break
        _signal_all(found, signal.SIGSTOP)  # no new forks while the round is killed
        _signal_all(found, signal.SIGKILL)
        killed.extend(p for p in found if p not in killed)
        time.sleep(0.02)
        if reap:
            reap_children()
    return killed


def join_cgroup(path: str | None) -> bool:
    """Move this process into the item's cgroup at ``path``; everything it starts stays in it."""
    if not path:
        return False
    try:
        with open(os.path.join(path, "cgroup.procs"), "w") as fh:
            fh.write(str(os.getpid()))
        return True
    except OSError:
        return False


def kill_cgroup(path: str | None) -> bool:
    """Kill every process of the cgroup at ``path`` (this one included, if it is in it)."""
    if not path:
        return False
    try:
        with open(os.path.join(path, "cgroup.kill"), "w") as fh:
            fh.write("1")
        return True
    except OSError:
        return False


def write_pids(path: str | None, pids: list[int]) -> None:
    """What a reaper killed, one pid a line, for the orchestrator to report."""
    if not path or not pids:
        return
    try:
        with open(path, "a") as fh:
            fh.write("".join(f"{pid}\n" for pid in pids))
    except OSError:
        pass


USAGE = "usage: python -m repros.runtime.lifeline --parent PID [--cgroup PATH] [--report PATH] -- COMMAND..."
#: How often the lifeline looks for its command's end and its orchestrator's.
POLL_S = 0.05


def _exit_like(status: int) -> int:
    """Leave as the command did: its exit code, or killed by its signal."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        return 128 + sig
    return os.WEXITSTATUS(status)


def run_contained(command: list[str], parent: int, cgroup: str | None, report: str | None) -> int:
    """Run COMMAND as this process's child, in the item's cgroup, as the item's subreaper: when it
    ends, kill what it left; when ``parent`` (the orchestrator) ends, kill everything and go."""
    join_cgroup(cgroup)
    become_subreaper()
    # The orchestrator stops an item by signalling its process group: the command handles the
    # signal (torchrun stops its ranks); the lifeline stays to collect what is left.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    if os.getppid() != parent:
        return 70
    lifeline = os.getpid()
    child = os.fork()
    if child == 0:
        try:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)
            die_with_parent(lifeline)  # the lifeline is killed last; the command never outlives it
            os.execvp(command[0], command)
        finally:
            os._exit(127)
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return 0
        if pid == child:
            write_pids(report, kill_descendants(reap=True))
            return _exit_like(status)
        if pid:
            continue  # an adopted orphan that ended: reaped
        if os.getppid() != parent:
            # The orchestrator is gone: nobody will stop the item or sweep after it.
            kill_descendants(reap=True)
            kill_cgroup(cgroup)
            return 70
        time.sleep(POLL_S)


def main(argv: list[str] | None = None) -> int:
    """``python -m repros.runtime.lifeline --parent PID [--cgroup PATH] [--report PATH] -- COMMAND...``:
    run COMMAND in the item's cgroup as the item's subreaper, so that nothing it starts outlives
    it, nor PID, the process that started it."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        split = args.index("--")
    except ValueError:
        print(USAGE, file=sys.stderr)
        return 2
    options, command = args[:split], args[split + 1 :]
    if not command or len(options) % 2 or options[:1] != ["--parent"]:
        print(USAGE, file=sys.stderr)
        return 2
    given = dict(zip(options[::2], options[1::2], strict=True))
    if set(given) - {"--parent", "--cgroup", "--report"}:
        print(USAGE, file=sys.stderr)
        return 2
    return run_contained(command, int(given["--parent"]), given.get("--cgroup"), given.get("--report"))


if __name__ == "__main__":
    sys.exit(main())
