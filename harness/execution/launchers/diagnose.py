"""What the machine did to an item, said as such: a full disk, an item directory that vanished.

Neither is the repro's doing nor the environment's, and neither leaves the records that would
say so (a rank that cannot write its record looks like a rank that crashed; a directory
removed from outside the run looks like ranks that never started). The launcher finds them
after the item and the item is INFRA with a reason that names the disk (its mount point, what
is free, the largest files where the run writes) or the directory. The disk named is the one the
write was refused on: the file a rank's error names (a scratch disk, ``/tmp``), else the item's own
where its own files could not be written; where a rank's error names no file, the reason says the
full filesystem is not known, and never blames one with space to spare.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.execution.launchers.logs import CappedLog
from harness.records.rank import RankRecord

#: An error a rank raised that says the disk refused a write (errno 28 ENOSPC, 122 EDQUOT).
_DISK_FULL_ERROR = re.compile(r"\[Errno (?:28|122)\]|No space left on device|Disk quota exceeded")
#: The file such an error names, as Python's ``OSError`` prints it (``...: '/scratch/ckpt.bin'``).
_REFUSED_FILE = re.compile(r"(?:No space left on device|Disk quota exceeded): '(?P<path>/[^']*)'")
#: Free space below which a filesystem is full for an item that left no records.
FULL_BELOW_BYTES = 2**20
#: The largest files named, and how many entries a scan for them reads at most.
LARGEST_COUNT = 3
SCAN_LIMIT = 20_000

DirIdentity = tuple[int, int]


def identity(path: Path) -> DirIdentity | None:
    """The directory's device and inode (a directory removed and made again is another one)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def directory_gone(item_dir: Path, before: DirIdentity | None) -> str:
    """Why the item is INFRA if its directory disappeared (or was replaced) while it ran, else ''."""
    if before is None:
        return ""
    now = identity(item_dir)
    if now == before:
        return ""
    how = "disappeared" if now is None else "was replaced by another directory"
    return (
        f"the item's directory {item_dir} {how} while the item ran (removed from outside the run): "
        "the ranks' records and logs went with it"
    )


def human(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def _existing(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path("/")


def mount_of(path: Path) -> tuple[str, str]:
    """The mount point holding ``path`` and its filesystem type (from ``/proc/self/mounts``)."""
    target = str(_existing(path).resolve())
    best, kind = "/", "?"
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return best, kind
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        point = parts[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, parts[2]
    return best, kind


def largest_files(root: Path, count: int = LARGEST_COUNT, limit: int = SCAN_LIMIT) -> list[tuple[Path, int]]:
    """The ``count`` largest files under ``root`` (reading at most ``limit`` entries)."""
    found: list[tuple[int, Path]] = []
    seen = 0
    todo = [root]
    while todo and seen < limit:
        try:
            entries = list(os.scandir(todo.pop()))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            try:
                if entry.is_dir(follow_symlinks=False):
                    todo.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    found.append((entry.stat(follow_symlinks=False).st_size, Path(entry.path)))
            except OSError:
                continue
    return [(path, size) for size, path in sorted(found, reverse=True)[:count]]


def _free(path: Path) -> tuple[int, int] | None:
    try:
        st = os.statvfs(_existing(path))
    except OSError:
        return None
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def disk_full_reason(refused: Path, what: str, scan_root: Path | None) -> str:
    """The reason of an item the disk refused: the filesystem the write was refused on (the one
    holding ``refused``), what failed, what fills it (the largest files under ``scan_root``, where
    there is one to look in)."""
    mount, kind = mount_of(refused)
    free = _free(refused)
    space = f" has {human(free[0])} free of {human(free[1])}" if free else ""
    filled = ""
    if scan_root is not None:
        largest = largest_files(scan_root)
        where = ", ".join(f"{_shown(path, scan_root)} ({human(size)})" for path, size in largest)
        filled = f"; the largest files under {scan_root}: {where}" if where else ""
    return f"the disk is full: the filesystem at {mount} ({kind}, holding {refused}){space}; {what}{filled}"


def unknown_disk_full_reason(item_dir: Path, what: str) -> str:
    """A rank's write was refused for want of space on a filesystem its error does not name: said
    so, with the item's own filesystem (which is then not the one, where it has room) for scale."""
    mount, _ = mount_of(item_dir)
    free = _free(item_dir)
    own = f"; the item's own, at {mount}, has {human(free[0])} free" if free else ""
    return f"a disk a rank wrote to is full (its error names no file, so which one is not known){own}; {what}"


@dataclass(frozen=True)
class DiskFull:
    """What says a disk was full during an item, and the file the write was refused on, where it is
    known (None: a rank's error that names no file)."""

    what: str
    refused: Path | None


def _shown(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def disk_full_evidence(
    logs: Iterable[CappedLog], records: dict[int, RankRecord | None], item_dir: Path, incomplete: bool
) -> DiskFull | None:
    """What says a disk was full during the item, or None: a log write it refused (the item's own
    disk), a rank's error that says so (the disk of the file it names), or (where the ranks left no
    final records) the item's filesystem with nothing free."""
    for log in logs:
        if log.disk_full and log.error is not None:
            return DiskFull(
                f"writing {log.path.name} failed ({log.error.strerror}; {human(log.lost)} of the item's "
                f"{human(log.received)} of output to it lost)",
                item_dir,
            )
    for rank, rec in sorted(records.items()):
        if rec is not None and rec.error is not None and _DISK_FULL_ERROR.search(rec.error.message):
            first = next((ln for ln in rec.error.message.splitlines() if ln.strip()), "")
            named = _REFUSED_FILE.search(rec.error.message)
            return DiskFull(f"rank {rank} raised {rec.error.type}: {first}", Path(named["path"]) if named else None)
    if incomplete:
        free = _free(item_dir)
        if free is not None and free[0] < FULL_BELOW_BYTES:
            unfinished = [r for r, rec in sorted(records.items()) if rec is None or rec.status == "running"]
            return DiskFull(f"ranks {unfinished} could not write their records", item_dir)
    return None


def machine_reason(
    item_dir: Path,
    before: DirIdentity | None,
    logs: Sequence[CappedLog],
    records: dict[int, RankRecord | None],
    scan_root: Path | None = None,
) -> str:
    """Why the machine, not the item, decides the item's outcome (INFRA), or ''."""
    gone = directory_gone(item_dir, before)
    if gone:
        return gone
    incomplete = any(rec is None or rec.status == "running" for rec in records.values())
    evidence = disk_full_evidence(logs, records, item_dir, incomplete)
    if evidence is None:
        return ""
    if evidence.refused is None:
        return unknown_disk_full_reason(item_dir, evidence.what)
    root: Path | None = Path(os.path.abspath(scan_root or item_dir.parent))
    if not evidence.refused.is_relative_to(item_dir) and not evidence.refused.is_relative_to(str(root)):
        # A disk outside the run (a scratch directory): what fills it is where the file was being
        # written, where that directory is there to look in.
        root = evidence.refused.parent if evidence.refused.parent.is_dir() else None
    return disk_full_reason(evidence.refused, evidence.what, root)
