"""Content digests known by a file's identity, so that what was verified once is not hashed again.

A seal says: the file at this (device, inode), as long as its size, modification time and change
time are these, holds content of this SHA-256. The change time is set by the kernel alone, at every
write, rename, ``utime``, ``chmod`` and link count change, so a file edited in any way since it was
sealed no longer matches its seal and is hashed again (the same trust the manifest's check puts in
a file whose times and inode did not move, ``integrity.py``).

Sealed are the files that are read again by other builds: the store's copies (``cache.py``), sealed
as they are linked (a link moves their change time: the new one is sealed with the content just
verified), and the files of uv's own cache an environment's files were copied from
(``uv_sources.py``), hashed once each instead of once per environment. An environment's own files
are not sealed: its manifest holds them.

The seals are one SQLite database in the cache (``seals.sqlite3``), shared by every process using
the cache; a database that cannot be opened or read means only that files are hashed again.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable, Iterator, Mapping
from contextlib import closing, contextmanager
from pathlib import Path

from harness.environments.integrity import digest_of

SEALS_FILE = "seals.sqlite3"
#: How long a writer waits for another process's write to finish.
BUSY_TIMEOUT_S = 30.0
#: Beyond this many seals, those whose file is gone are dropped (``prune``).
KEPT = 200_000
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS seals (dev INTEGER, ino INTEGER, size INTEGER, mtime_ns INTEGER, "
    "ctime_ns INTEGER, digest TEXT NOT NULL, path TEXT NOT NULL, PRIMARY KEY (dev, ino))"
)
#: A file's identity and state as a seal holds them.
Stamp = tuple[int, int, int, int, int]


def stamp(st: os.stat_result) -> Stamp:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class Seals:
    """The cache's seals (``<cache>/seals.sqlite3``)."""

    def __init__(self, cache_dir: Path) -> None:
        self.path = Path(cache_dir) / SEALS_FILE

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection | None]:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            connection = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        except (OSError, sqlite3.Error):
            yield None
            return
        with closing(connection):
            try:
                connection.execute("PRAGMA journal_mode=WAL")
                connection.execute(_SCHEMA)
            except sqlite3.Error:
                yield None
                return
            yield connection

    def known(self, stats: Iterable[os.stat_result]) -> dict[tuple[int, int], str]:
        """The digest of each file whose seal matches it as it is now, by (device, inode)."""
        wanted = {(st.st_dev, st.st_ino): stamp(st) for st in stats}
        found: dict[tuple[int, int], str] = {}
        if not wanted:
            return found
        by_device: dict[int, list[int]] = {}
        for dev, ino in wanted:
            by_device.setdefault(dev, []).append(ino)
        with self._db() as db:
            if db is None:
                return found
            try:
                for dev, inodes in by_device.items():
                    for start in range(0, len(inodes), 900):
                        chunk = inodes[start : start + 900]
                        rows = db.execute(
                            "SELECT ino, size, mtime_ns, ctime_ns, digest FROM seals "  # noqa: S608 - placeholders only
                            f"WHERE dev = ? AND ino IN ({', '.join('?' * len(chunk))})",
                            [dev, *chunk],
                        )
                        for ino, size, mtime_ns, ctime_ns, digest in rows:
                            if wanted.get((dev, ino)) == (dev, ino, size, mtime_ns, ctime_ns):
                                found[(dev, ino)] = str(digest)
            except sqlite3.Error:
                return {}
        return found

    def seal(self, sealed: Mapping[str | Path, tuple[os.stat_result, str]]) -> None:
        """Seal each file (its path -> its state as verified, and the digest of its content then)."""
        if not sealed:
            return
        rows = [(*stamp(st), digest, str(path)) for path, (st, digest) in sealed.items()]
        with self._db() as db:
            if db is None:
                return
            try:
                db.execute("BEGIN IMMEDIATE")
                db.executemany("INSERT OR REPLACE INTO seals VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
                db.execute("COMMIT")
            except sqlite3.Error:
                return
        if len(rows) > 1000:
            self.prune()

    def digests(self, files: Mapping[str, os.stat_result]) -> dict[str, str | OSError]:
        """Each file's digest (its path -> its ``lstat``): its seal's where it matches the file as it is,
        else hashed (and sealed)."""
        known = self.known(files.values())
        result: dict[str, str | OSError] = {}
        fresh: dict[str | Path, tuple[os.stat_result, str]] = {}
        for path, st in files.items():
            digest = known.get((st.st_dev, st.st_ino))
            if digest is None:
                try:
                    digest = digest_of(path)
                    after = os.lstat(path)
                except OSError as exc:
                    result[path] = exc
                    continue
                if stamp(after) == stamp(st):  # not changed while it was read: its digest is its content's
                    fresh[path] = (st, digest)
            result[path] = digest
        self.seal(fresh)
        return result

    def prune(self) -> int:
        """Past ``KEPT`` seals, drop those whose file is gone or changed; how many were dropped."""
        with self._db() as db:
            if db is None:
                return 0
            try:
                (count,) = db.execute("SELECT COUNT(*) FROM seals").fetchone()
                if count <= KEPT:
                    return 0
                stale = []
                for dev, ino, size, mtime_ns, ctime_ns, path in db.execute(
                    "SELECT dev, ino, size, mtime_ns, ctime_ns, path FROM seals"
                ):
                    try:
                        now = stamp(os.lstat(path))
                    except OSError:
                        now = None
                    if now != (dev, ino, size, mtime_ns, ctime_ns):
                        stale.append((dev, ino))
                db.execute("BEGIN IMMEDIATE")
                db.executemany("DELETE FROM seals WHERE dev = ? AND ino = ?", stale)
                db.execute("COMMIT")
            except sqlite3.Error:
                return 0
        return len(stale)
