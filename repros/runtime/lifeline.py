"""Die with the orchestrator: what keeps an item's processes from outliving a killed run.

Standard library only. ``die_with_parent`` asks the kernel to SIGKILL this process when its
parent ends (Linux ``PR_SET_PDEATHSIG``), and checks the parent is still the one it was
started by (it may have died before the request was made). A process started with
``ORCHESTRATOR_VARIABLE`` in its environment belongs to that orchestrator (``pid:start``), so
a later run can find and stop what a killed run left behind.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

ORCHESTRATOR_VARIABLE = "FT_REGRESS_ORCHESTRATOR"
_PR_SET_PDEATHSIG = 1


def die_with_parent(expected_parent: int | None = None) -> bool:
    """SIGKILL this process when its parent ends; False where the kernel cannot do it.
    Exits at once if the parent is already gone (``expected_parent`` no longer its parent)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(70)  # the parent died before the request was made
    return True


def process_start_time(pid: int) -> str | None:
    """The start time of ``pid`` in clock ticks since boot (field 22 of /proc/PID/stat)."""
    try:
        stat = open(f"/proc/{pid}/stat").read()
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


USAGE = "usage: python -m repros.runtime.lifeline --parent PID [--cgroup PATH] -- COMMAND..."


def main(argv: list[str] | None = None) -> int:
    """``python -m repros.runtime.lifeline --parent PID [--cgroup PATH] -- COMMAND...``: run COMMAND
    (exec, same process) in the item's cgroup, so that it is killed when PID, the process that
    started it, ends."""
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
    join_cgroup(given.get("--cgroup"))
    die_with_parent(int(given["--parent"]))
    os.execvp(command[0], command)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
