"""The environment cache on disk: what each environment takes, when it was last used and by which
cells, which are in use now, a budget that evicts the least recently used, and one copy of each
file that several environments hold.

- Use: every time a cell gets an environment, ``use.json`` beside it records the time and the
  cell; the least recently used are evicted first.
- In use: a process holds a shared lock on ``envs/<key>.inuse`` while it may use the environment
  (from getting it until it lets go, at the latest when the process ends, whatever kills it).
  Eviction takes the lock exclusively without waiting: an environment another process holds is
  skipped, never removed under it.
- Budget: ``--cache-max-gb`` (or ``$FT_REGRESS_CACHE_MAX_GB``); by default half of what the cache
  could have (what it takes plus the free space of its filesystem). Before an environment is built,
  the least recently used environments not in use are removed until the cache and the new one
  (estimated at the size of the largest so far) fit.
- Sharing: once built, every file of 16 KiB or more is replaced by a hard link to one copy in
  ``store/`` (by content and mode): environments of the same torch share its gigabyte. uv's own
  cache is never linked to (its files stay copies, ``--link-mode copy``). A shared file edited in
  place changes its content in every environment that holds it, so the manifest check
  (``integrity.py``: content digests, change times) reports each of them damaged and rebuilds it;
  and the store's copy is verified again before anything new is linked to it (by its seal where it
  has not changed since it was last verified, ``seals.py``, else hashed): a copy that no longer
  holds what its name says is replaced, never spread. What uv copied unchanged from its own cache
  takes the digest of the file it was copied from, hashed once (``uv_sources.py``). Nothing is
  trusted on faith.
- A full disk is said as such: how much is free, what the cache takes, and the command that frees it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import fcntl
import json
import os
import shutil
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from harness.environments.integrity import MANIFEST, changing, damage, digest_of, write_manifest
from harness.environments.seals import Seals

ENVS = "envs"
STORE = "store"
USE_FILE = "use.json"
SIZE_FILE = "size.json"
READY_MARKER = "READY"
#: Files smaller than this are left as they are (a link saves little and costs a hash).
SHARE_MIN_BYTES = 16 * 1024
#: The most cells ``use.json`` remembers.
CELLS_KEPT = 20
GB = 1024**3
#: What the default budget leaves the disk: half of what the cache could have.
DEFAULT_SHARE = 0.5


def envs_dir(cache_dir: Path) -> Path:
    return cache_dir / ENVS


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


# ----------------------------------------------------------------------------- use


def note_use(env_dir: Path, cell: str) -> None:
    """Record that ``cell`` used the environment now (written whole: a temporary file renamed)."""
    path = env_dir / USE_FILE
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        cells = [c for c in raw.get("cells", []) if isinstance(c, str)]
    except (OSError, ValueError, AttributeError):
        cells = []
    cells = [c for c in cells if c != cell][-(CELLS_KEPT - 1) :] + [cell]
    tmp = path.with_suffix(".json.tmp")
    try:
        tmp.write_text(json.dumps({"last_used": _now(), "cells": cells}), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)  # a full disk must not stop the run over bookkeeping


class Holds:
    """This process's shared locks on the environments it may use (``envs/<key>.inuse``)."""

    def __init__(self, cache_dir: Path) -> None:
        self.cache_dir = cache_dir
        self._held: dict[str, IO[str]] = {}

    def hold(self, key: str) -> None:
        if key in self._held:
            return
        path = envs_dir(self.cache_dir) / f"{key}.inuse"
        path.parent.mkdir(parents=True, exist_ok=True)
        self._held[key] = flock_current(path, fcntl.LOCK_SH)

    def release(self, key: str) -> None:
        handle = self._held.pop(key, None)
        if handle is not None:
            handle.close()

    def held(self) -> set[str]:
        return set(self._held)


def flock_current(path: Path, operation: int) -> IO[str]:
    """``path`` opened and locked (``flock``, waiting), the lock taken on the file the path names once
    it is granted. An evictor unlinks an environment's lock files once it is done: a lock granted
    on the unlinked file would hold nothing, so it is dropped and taken again on the current one."""
    while True:
        handle = open(path, "a")  # noqa: SIM115 - returned open, locked
        try:
            fcntl.flock(handle, operation)
            if os.fstat(handle.fileno()).st_ino == os.stat(path).st_ino:
                return handle
        except FileNotFoundError:
            pass  # unlinked while we waited: take it again on a new file
        except BaseException:
            handle.close()
            raise
        handle.close()


def in_use(cache_dir: Path, key: str) -> bool:
    """Whether any process holds the environment (its lock cannot be had exclusively now)."""
    path = envs_dir(cache_dir) / f"{key}.inuse"
    if not path.exists():
        return False
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return True
            raise
        fcntl.flock(handle, fcntl.LOCK_UN)
        return False


# ----------------------------------------------------------------------------- sizes


def _files(root: Path) -> Iterable[os.stat_result]:
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            try:
                yield os.lstat(os.path.join(dirpath, name))
            except FileNotFoundError:
                continue


def apparent_bytes(root: Path) -> int:
    return sum(st.st_size for st in _files(root) if stat.S_ISREG(st.st_mode))


def disk_bytes(roots: Iterable[Path]) -> int:
    """What ``roots`` take on disk, a file linked from several places counted once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for root in roots:
        for st in _files(root):
            if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def recorded_size(env_dir: Path) -> int | None:
    """What an environment takes, every file counted (``size.json``, written as it was built)."""
    try:
        return int(json.loads((env_dir / SIZE_FILE).read_text(encoding="utf-8"))["apparent"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_size(env_dir: Path) -> int:
    size = apparent_bytes(env_dir)
    (env_dir / SIZE_FILE).write_text(json.dumps({"apparent": size}), encoding="utf-8")
    return size


@dataclass(frozen=True)
class CacheEntry:
    key: str
    path: Path
    ready: bool
    #: Every file's size, shared or not (what it would take alone).
    apparent_bytes: int
    last_used: str | None
    cells: list[str] = field(default_factory=list)
    in_use: bool = False
    #: Bytes only this environment holds (files no other environment or the store links to).
    own_bytes: int | None = None


def entries(cache_dir: Path, with_own_bytes: bool = False) -> list[CacheEntry]:
    """Every environment in the cache, least recently used first."""
    found = []
    root = envs_dir(cache_dir)
    if not root.is_dir():
        return []
    for env_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        try:
            use = json.loads((env_dir / USE_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            use = {}
        size = recorded_size(env_dir)
        if size is None:
            size = apparent_bytes(env_dir)
        ready = (env_dir / READY_MARKER).exists()
        last = use.get("last_used") if isinstance(use, dict) else None
        if last is None and ready:
            last = dt.datetime.fromtimestamp((env_dir / READY_MARKER).stat().st_mtime, dt.UTC).isoformat(
                timespec="seconds"
            )
        own = None
        if with_own_bytes:
            own = sum(st.st_blocks * 512 for st in _files(env_dir) if stat.S_ISREG(st.st_mode) and st.st_nlink == 1)
        found.append(
            CacheEntry(
                key=env_dir.name,
                path=env_dir,
                ready=ready,
                apparent_bytes=size,
                last_used=last,
                cells=list(use.get("cells", [])) if isinstance(use, dict) else [],
                in_use=in_use(cache_dir, env_dir.name),
                own_bytes=own,
            )
        )
    return sorted(found, key=lambda e: e.last_used or "")


# ----------------------------------------------------------------------------- budget


def budget_bytes(cache_dir: Path, max_gb: float | None = None) -> int:
    """The budget: ``max_gb``, else ``$FT_REGRESS_CACHE_MAX_GB``, else half of what the cache could
    have (what its environments take now plus the free space)."""
    if max_gb is None and os.environ.get("FT_REGRESS_CACHE_MAX_GB"):
        max_gb = float(os.environ["FT_REGRESS_CACHE_MAX_GB"])
    if max_gb is not None:
        return int(max_gb * GB)
    cache_dir.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(cache_dir).free
    return int(DEFAULT_SHARE * (free + cache_bytes(cache_dir)))


def cache_bytes(cache_dir: Path) -> int:
    return disk_bytes([envs_dir(cache_dir), cache_dir / STORE])


@dataclass(frozen=True)
class Eviction:
    removed: list[CacheEntry]
    #: Bytes the cache takes after it, and the budget.
    after_bytes: int
    budget: int
    #: Environments over the budget that could not go: in use, or kept for this run.
    kept_in_use: list[str]


def evict_to_fit(cache_dir: Path, budget: int, incoming: int = 0, keep: Iterable[str] = ()) -> Eviction:
    """Remove the least recently used environments (never one in use or in ``keep``) until the cache
    and ``incoming`` more bytes fit in ``budget``; then the store's files no environment links to."""
    keep = set(keep)
    removed: list[CacheEntry] = []
    skipped: list[str] = []
    used = cache_bytes(cache_dir)
    for entry in entries(cache_dir):
        if used + incoming <= budget:
            break
        if entry.key in keep or entry.in_use:
            skipped.append(entry.key)
            continue
        lock = envs_dir(cache_dir) / f"{entry.key}.inuse"
        with open(lock, "a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                skipped.append(entry.key)  # taken since we looked
                continue
            shutil.rmtree(entry.path, ignore_errors=True)
            # ``<key>.lock`` (the build lock) stays: unlinking it under a builder that holds it would
            # let a second builder lock a new file and build into the same directory.
            # Unlinked while still held: a process waiting for it is granted the removed file, sees
            # that (``flock_current``) and takes a new one, then finds the environment gone.
            lock.unlink(missing_ok=True)
        prune_store(cache_dir)
        removed.append(entry)
        used = cache_bytes(cache_dir)
    return Eviction(removed, used, budget, skipped)


def largest_environment(cache_dir: Path, default: int = GB) -> int:
    sizes = [e.apparent_bytes for e in entries(cache_dir) if e.ready]
    return max(sizes) if sizes else default


# ----------------------------------------------------------------------------- sharing


def _content_key(digest: str, st: os.stat_result) -> str:
    return f"{digest}-{stat.S_IMODE(st.st_mode):o}"


@dataclass(frozen=True)
class Shared:
    files: int
    bytes_saved: int
    #: (device, inode) -> the SHA-256 of the content, verified while sharing (the manifest's digests).
    digests: dict[tuple[int, int], str] = field(default_factory=dict, repr=False, compare=False)

    def counts(self) -> dict[str, int]:
        return {"files": self.files, "bytes_saved": self.bytes_saved}


def _store_copy_is(target: Path, digest: str, mode: int, sealed: Mapping[tuple[int, int], str]) -> bool:
    """Whether the store's copy still holds the content (and mode) its name says: a copy edited in
    place since it was stored is never linked to again. ``sealed``: the digests its seal vouches for
    (``seals.py``), by (device, inode), where it has not changed since it was last verified."""
    try:
        st = os.lstat(target)
        if not stat.S_ISREG(st.st_mode) or stat.S_IMODE(st.st_mode) != mode:
            return False
        return sealed.get((st.st_dev, st.st_ino)) == digest or digest_of(target) == digest
    except OSError:
        return False


def _sharable(tree: Path) -> Iterable[tuple[Path, os.stat_result]]:
    """The files of ``tree`` worth a link to the store (``SHARE_MIN_BYTES`` or more, not linked yet)."""
    for dirpath, _, filenames in os.walk(tree):
        for name in filenames:
            path = Path(dirpath) / name
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode) and st.st_size >= SHARE_MIN_BYTES and st.st_nlink == 1:
                yield path, st


def share_files(
    tree: Path, cache_dir: Path, known: Mapping[tuple[int, int], str] | None = None, seals: Seals | None = None
) -> Shared:
    """Replace each file of ``tree`` of ``SHARE_MIN_BYTES`` or more with a hard link to the store's
    copy of the same content and mode (the store takes this copy where it has none, or where its copy
    no longer holds what its name says). ``known``: digests already known, by (device, inode), not
    computed again (``uv_sources.py``); ``seals``: the store's copies are verified by their seals
    where those match, and sealed as they are linked."""
    store = cache_dir / STORE
    files = saved = 0
    digests: dict[tuple[int, int], str] = {}
    known = known or {}
    found = []
    for path, st in _sharable(tree):
        try:
            digest = known.get((st.st_dev, st.st_ino)) or digest_of(path)
        except OSError:
            continue
        key = _content_key(digest, st)
        found.append((path, st, digest, store / key[:2] / key))
    targets = []
    for *_, target in found:
        with contextlib.suppress(OSError):
            targets.append(os.lstat(target))
    sealed = seals.known(targets) if seals is not None else {}
    linked: dict[str | Path, tuple[os.stat_result, str]] = {}
    for path, st, digest, target in found:
        # By the inode the name holds after sharing: a replaced inode's number may be reused.
        digests[(st.st_dev, st.st_ino)] = digest
        try:
            if target.exists() and _store_copy_is(target, digest, stat.S_IMODE(st.st_mode), sealed):
                tmp = path.with_name(f".{path.name}.ft-link")
                os.link(target, tmp)
                os.replace(tmp, path)
                del digests[(st.st_dev, st.st_ino)]
                now = os.lstat(path)
                digests[(now.st_dev, now.st_ino)] = digest
                saved += st.st_size
            else:
                # None yet, or a damaged one (the environments holding it find it so themselves).
                target.unlink(missing_ok=True)
                target.parent.mkdir(parents=True, exist_ok=True)
                os.link(path, target)
                now = os.lstat(target)
            linked[target] = (now, digest)  # the link moved its change time: sealed as it is now
            files += 1
        except OSError:
            continue  # another filesystem, a link limit: the copy stays
    if seals is not None:
        seals.seal(linked)
    return Shared(files, saved, digests)


def share_existing(cache_dir: Path, key: str) -> Shared | None:
    """Share an environment built before sharing: under its build lock, only where it is whole (its
    manifest finds no damage), the manifest written again after. None where it was in use, damaged
    or not ready."""
    env_dir = envs_dir(cache_dir) / key
    if not (env_dir / READY_MARKER).exists() or in_use(cache_dir, key):
        return None
    with open(envs_dir(cache_dir) / f"{key}.lock", "a") as build_lock:
        fcntl.flock(build_lock, fcntl.LOCK_EX)
        if damage(env_dir):
            return None
        tree = Path(json.loads((env_dir / MANIFEST).read_text(encoding="utf-8"))["tree"])
        with changing(env_dir):  # a check under way elsewhere never sees the links before the manifest
            shared = share_files(tree, cache_dir)
            write_manifest(env_dir, tree, shared.digests)
        write_size(env_dir)
        return shared


def prune_store(cache_dir: Path) -> int:
    """Remove the store's files no environment links to any more; return the bytes freed."""
    store = cache_dir / STORE
    freed = 0
    if not store.is_dir():
        return 0
    for dirpath, _, filenames in os.walk(store):
        for name in filenames:
            path = Path(dirpath) / name
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if st.st_nlink == 1:
                path.unlink(missing_ok=True)
                freed += st.st_blocks * 512
    return freed


# ----------------------------------------------------------------------------- a full disk

NO_SPACE = ("No space left on device", "os error 28", "[Errno 28]", "Disk quota exceeded")


def is_disk_full(text: str) -> bool:
    return any(mark in text for mark in NO_SPACE)


def disk_full_reason(cache_dir: Path) -> str:
    """What to say when a build ran out of disk: how much is free, what the cache takes, the fix."""
    try:
        free = shutil.disk_usage(cache_dir if cache_dir.exists() else cache_dir.parent).free
    except OSError:
        free = 0
    taken = cache_bytes(cache_dir) if cache_dir.exists() else 0
    return (
        f"the disk is full: {free / GB:.1f} GB free where the environments are kept ({cache_dir}), which take "
        f"{taken / GB:.1f} GB; free space with `ft-regress cache prune --max-gb N` (and `uv cache prune` for "
        "uv's own cache), or give the runs a budget with --cache-max-gb"
    )
