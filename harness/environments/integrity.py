"""Is a built environment still what was built? A manifest of its files' content, checked cheaply.

At the end of a build every entry of the environment's interpreter tree is listed in
``manifest.json``: each file with its size, modification and change times, inode, mode and the
SHA-256 of its content; each symbolic link with its target. Bytecode (``__pycache__``) is listed
like any other file: nothing run in the environment writes any (``bytecode.py``), the harness places
what items compiled and lists it as it does (``add_files``, under ``changing``: a check holds the
manifest's lock shared, so it never sees a file placed before the manifest lists it), and a ``.pyc``
added or changed otherwise (bytecode Python would load instead of its source) is damage like an
edited source.

Before an environment is reused, and before and after every item that runs in it, the tree is
walked again (a ``stat`` per file: well under a second for a torch environment) and compared.
What ``os.utime`` can restore (the modification time) is not trusted alone: every write, rename,
``utime`` or ``chmod`` also moves the change time, which only the kernel sets, and a file replaced
by another has another inode. Where any of these moved but the size and mode did not, the content
is hashed and compared with the digest recorded at build (unless its seal vouches for it as it is
now, ``seals.py``: a store copy another environment linked since); the same content is not damage
(a hard link to the shared ``store/`` made or removed by another environment moves the change time
of every name of the file), and the manifest then records the new times, so the next check is
cheap again. A file edited, added, removed, re-linked or changed in mode is damage, named in the reason.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import stat
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Protocol

MANIFEST = "manifest.json"
#: Checks hold it shared, a change to a ready environment and its manifest (bytecode placed in) holds
#: it alone: a check never sees a file added before the manifest that lists it.
MANIFEST_LOCK = "manifest.lock"
#: The manifest's format: 2 holds content digests (1, sizes and times only, cannot vouch for content).
FORMAT = 2
#: The most differences a reason names.
SHOWN = 5
#: (device, inode) -> digest: what a caller already hashed (``cache.share_files``), not hashed again.
Known = Mapping[tuple[int, int], str]


class Sealed(Protocol):
    """Digests known by a file's identity and state (``seals.py``): asked before a moved file is hashed,
    and told what a check verified of a file other environments hold too."""

    def known(self, stats: Iterable[os.stat_result]) -> Known: ...

    def seal(self, sealed: Mapping[str | Path, tuple[os.stat_result, str]]) -> None: ...


class FileEntry(NamedTuple):
    size: int
    mtime_ns: int
    ctime_ns: int
    ino: int
    mode: int
    #: SHA-256 of the content ("" for what is neither a file nor a link: a fifo, a socket).
    digest: str


@dataclass
class _Scan:
    files: dict[str, os.stat_result]
    links: dict[str, str]


def _scan(root: Path) -> _Scan:
    """Every file (lstat) and symbolic link (its target) under ``root``; links are not followed."""
    found = _Scan({}, {})
    pending = [str(root)]
    base = len(str(root)) + 1
    while pending:
        directory = pending.pop()
        try:
            entries = list(os.scandir(directory))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            rel = entry.path[base:]
            try:
                if entry.is_symlink():
                    found.links[rel] = os.readlink(entry.path)
                elif entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
                else:
                    found.files[rel] = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
    return found


def digest_of(path: str | Path) -> str:
    """SHA-256 of a file's content (read in chunks: bounded memory)."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _entry(st: os.stat_result, digest: str) -> FileEntry:
    return FileEntry(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_mode, digest)


def _write(env_dir: Path, tree: Path, files: Mapping[str, FileEntry], links: Mapping[str, str]) -> None:
    payload = {
        "format": FORMAT,
        "tree": str(tree),
        "files": {rel: list(files[rel]) for rel in sorted(files)},
        "links": {rel: links[rel] for rel in sorted(links)},
    }
    # Unique per writer: two checks refreshing the same manifest never share a temporary file.
    tmp = env_dir / f"{MANIFEST}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        tmp.write_text(json.dumps(payload, separators=(",", ":")), encoding="utf-8")
        seen = _file_id(tmp)
        os.replace(tmp, env_dir / MANIFEST)
    finally:
        tmp.unlink(missing_ok=True)
    entries = dict(files)
    _remember(env_dir / MANIFEST, seen, _Manifest(tree, entries, dict(links), _stats(entries)))


def write_manifest(env_dir: Path, tree: Path, known: Known | None = None) -> int:
    """List ``tree``'s files, with their content digests, in ``env_dir/manifest.json``; return how
    many files. ``known``: digests already computed, by (device, inode), not computed again."""
    found = _scan(tree)
    known = known or {}
    digests = {rel: "" for rel, st in found.files.items() if not stat.S_ISREG(st.st_mode)}
    digests |= {rel: d for rel, st in found.files.items() if (d := known.get((st.st_dev, st.st_ino)))}
    unknown = sorted(set(found.files) - set(digests))
    for rel, digest in zip(unknown, _digests([tree / rel for rel in unknown]), strict=True):
        if isinstance(digest, OSError):
            raise digest
        digests[rel] = digest
    _write(env_dir, tree, {rel: _entry(st, digests[rel]) for rel, st in found.files.items()}, found.links)
    return len(found.files)


class _Manifest(NamedTuple):
    tree: Path
    files: dict[str, FileEntry]
    links: dict[str, str]
    #: Each file's (size, mtime, ctime, inode, mode): what a walk that finds nothing moved compares.
    stats: dict[str, tuple[int, ...]]


def _stats(files: Mapping[str, FileEntry]) -> dict[str, tuple[int, ...]]:
    return {rel: tuple(entry[:5]) for rel, entry in files.items()}


def _found_stats(found: _Scan) -> dict[str, tuple[int, ...]]:
    return {rel: (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_mode) for rel, st in found.files.items()}


#: Manifests read by this process, by path, with the (inode, size, mtime) of the file they were read
#: from: a check reads ``manifest.json`` again only where it was rewritten (parsing one for a torch
#: environment, ~13 MiB in memory, costs about as much as walking the tree). The most recently used
#: few: a run checks one cell's environment item after item (a few at once with ``--jobs``).
_READ: OrderedDict[Path, tuple[tuple[int, int, int], _Manifest]] = OrderedDict()
_READ_KEPT = 4
_READ_LOCK = threading.Lock()


def _remember(path: Path, seen: tuple[int, int, int], manifest: _Manifest) -> None:
    with _READ_LOCK:
        _READ[path] = (seen, manifest)
        _READ.move_to_end(path)
        while len(_READ) > _READ_KEPT:
            _READ.popitem(last=False)


def _file_id(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _row(row: list[object]) -> FileEntry:
    if len(row) != len(FileEntry._fields) or not isinstance(row[5], str):
        raise ValueError(f"a file's entry has {len(row)} fields, not {len(FileEntry._fields)}")
    size, mtime_ns, ctime_ns, ino, mode = row[:5]
    if not (type(size) is type(mtime_ns) is type(ctime_ns) is type(ino) is type(mode) is int):
        raise ValueError(f"a file's entry has a field that is not an integer: {row[:5]}")
    return FileEntry(size, mtime_ns, ctime_ns, ino, mode, row[5])


def _read(env_dir: Path) -> _Manifest | str:
    """The manifest, or what is wrong with it (a manifest of a tree elsewhere: ``moved``)."""
    manifest = _read_cached(env_dir)
    if isinstance(manifest, _Manifest):
        return moved(env_dir, manifest.tree) or manifest
    return manifest


def _read_cached(env_dir: Path) -> _Manifest | str:
    """The manifest, or what is wrong with it (parsed once per version of the file)."""
    path = env_dir / MANIFEST
    try:
        seen = _file_id(path)
    except FileNotFoundError:
        return f"{path} is missing"
    except OSError as exc:
        return f"{path} is unreadable ({exc})"
    with _READ_LOCK:
        cached = _READ.get(path)
    if cached is not None and cached[0] == seen:
        _remember(path, seen, cached[1])
        return cached[1]
    manifest = _parse(path)
    if isinstance(manifest, _Manifest):
        _remember(path, seen, manifest)
    return manifest


def moved(env_dir: Path, tree: Path) -> str | None:
    """Why ``env_dir``'s manifest cannot vouch for it where its tree is not inside it (None where it is): the
    cache was moved or copied (``cp -al``, a CI cache restored elsewhere), and what the environment's files name
    (its interpreter, its scripts, this manifest) is the original's. It is built again where it is now, never
    run from, judged by or written into the original."""
    here = os.path.realpath(env_dir)
    if os.path.commonpath([here, os.path.realpath(tree)]) == here:
        return None
    return (
        f"it was built in {tree.parent}, not in {env_dir}: a cache moved or copied keeps the paths of where it was "
        "built, so each of its environments is built again where the cache is now"
    )


def _parse(path: Path) -> _Manifest | str:
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"{path} is missing"
    except (OSError, ValueError) as exc:
        return f"{path} is unreadable ({exc})"
    if not isinstance(payload, dict):
        return f"{path} is unreadable (not an object)"
    if payload.get("format") != FORMAT:
        return f"{path} was written by an older version, without content digests, and cannot vouch for the files"
    try:
        tree = Path(payload["tree"])
        files = {str(rel): _row(row) for rel, row in payload["files"].items()}
        links = {str(rel): str(target) for rel, target in payload["links"].items()}
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        return f"{path} is unreadable ({type(exc).__name__}: {exc})"
    return _Manifest(tree, files, links, _stats(files))


def _is_bytecode(rel: str) -> bool:
    return "__pycache__" in Path(rel).parts or rel.endswith((".pyc", ".pyo"))


def _added(tree: Path, rel: str) -> str:
    if _is_bytecode(rel):
        return f"{tree / rel} was added (bytecode the build did not make: Python would load it instead of the source)"
    return f"{tree / rel} was added"


def _stat_change(tree: Path, rel: str, was: FileEntry, st: os.stat_result) -> str | None:
    """What a ``stat`` alone shows changed in a file listed as ``was`` and found as ``st``."""
    if stat.S_IFMT(st.st_mode) != stat.S_IFMT(was.mode):
        return f"{tree / rel} was modified (replaced by another kind of file)"
    if st.st_mode != was.mode:
        return f"{tree / rel} was modified (mode {stat.S_IMODE(was.mode):o} is now {stat.S_IMODE(st.st_mode):o})"
    if st.st_size != was.size:
        return f"{tree / rel} was modified (size {was.size} is now {st.st_size})"
    return None


def _unmoved(was: FileEntry, st: os.stat_result) -> bool:
    return (st.st_mtime_ns, st.st_ctime_ns, st.st_ino) == (was.mtime_ns, was.ctime_ns, was.ino)


def _digests(paths: list[Path]) -> list[str | OSError]:
    """Each file's digest (or why it cannot be read), hashed on every core: hashing and reading
    release the GIL."""

    def one(path: Path) -> str | OSError:
        try:
            return digest_of(path)
        except OSError as exc:
            return exc

    if len(paths) < 2:
        return [one(p) for p in paths]
    with ThreadPoolExecutor(max_workers=min(len(paths), os.cpu_count() or 1)) as pool:
        return list(pool.map(one, paths))


@contextmanager
def _manifest_locked(env_dir: Path, operation: int) -> Iterator[None]:
    """``MANIFEST_LOCK`` held (``fcntl.LOCK_SH`` or ``LOCK_EX``); where it cannot be opened (the
    environment is gone, a read-only cache) there is nothing to coordinate with."""
    try:
        handle = open(env_dir / MANIFEST_LOCK, "a")  # noqa: SIM115 - closed below
    except OSError:
        yield
        return
    with handle:
        fcntl.flock(handle, operation)
        yield


@contextmanager
def changing(env_dir: Path) -> Iterator[None]:
    """Hold the environment's files and manifest alone (no check runs meanwhile): to add files to a
    ready environment and list them (``add_files``)."""
    with _manifest_locked(env_dir, fcntl.LOCK_EX):
        yield


def listed(env_dir: Path) -> tuple[Path, Mapping[str, FileEntry]] | None:
    """The manifest's tree and files (None where it is missing or unreadable)."""
    manifest = _read(env_dir)
    return None if isinstance(manifest, str) else (manifest.tree, manifest.files)


def add_files(env_dir: Path, added: Mapping[str, str]) -> None:
    """List files just added to the tree (relative path -> the SHA-256 of their content, known to
    the caller) in the manifest, as they are now. Under ``changing``."""
    manifest = _read(env_dir)
    if isinstance(manifest, str):
        raise OSError(f"cannot add to the manifest: {manifest}")
    entries = {rel: _entry(os.lstat(manifest.tree / rel), digest) for rel, digest in added.items()}
    _write(env_dir, manifest.tree, {**manifest.files, **entries}, manifest.links)


def damage(env_dir: Path, sealed: Sealed | None = None) -> list[str]:
    """What differs from the manifest ([] when nothing); a missing, unreadable or older manifest is
    damage. Where only times or inodes moved and the content is the same, the manifest is brought
    up to date (nothing is damaged, and the next check need not hash those files again). ``sealed``:
    a moved file whose seal vouches for it as it is now (a store copy another environment linked
    since) is not read."""
    with _manifest_locked(env_dir, fcntl.LOCK_SH):
        return _damage(env_dir, sealed)


def _damage(env_dir: Path, sealed: Sealed | None = None) -> list[str]:
    manifest = _read(env_dir)
    if isinstance(manifest, str):
        return [manifest]
    tree = manifest.tree
    found = _scan(tree)
    if found.links == manifest.links and _found_stats(found) == manifest.stats:
        return []  # nothing moved: every file as listed (the usual case, and the cheap one)
    problems: dict[str, str] = {}
    to_hash: list[str] = []
    listed_names = set(manifest.files) | set(manifest.links)
    found_names = set(found.files) | set(found.links)
    for rel in listed_names | found_names:
        if rel not in found_names:
            problems[rel] = f"{tree / rel} was removed"
        elif rel not in listed_names:
            problems[rel] = _added(tree, rel)
        elif rel in manifest.links:
            if rel not in found.links:
                problems[rel] = f"{tree / rel} was modified (a link replaced by a file)"
            elif found.links[rel] != manifest.links[rel]:
                problems[rel] = (
                    f"{tree / rel} was modified (its link to {manifest.links[rel]} now leads to {found.links[rel]})"
                )
        elif rel in found.links:
            problems[rel] = f"{tree / rel} was modified (replaced by a link to {found.links[rel]})"
        else:
            was, st = manifest.files[rel], found.files[rel]
            problem = _stat_change(tree, rel, was, st)
            if problem:
                problems[rel] = problem
            elif not _unmoved(was, st):
                to_hash.append(rel)
    # Times or inode moved, size and mode did not: only the content can say whether it changed.
    moved: dict[str, FileEntry] = {}
    regular = [rel for rel in to_hash if stat.S_ISREG(found.files[rel].st_mode)]
    for rel in to_hash:
        if not stat.S_ISREG(found.files[rel].st_mode):
            moved[rel] = _entry(found.files[rel], manifest.files[rel].digest)
    vouched = sealed.known(found.files[rel] for rel in regular) if sealed is not None and regular else {}
    unread = []
    for rel in regular:
        st = found.files[rel]
        digest = vouched.get((st.st_dev, st.st_ino))
        if digest is None:
            unread.append(rel)
        elif digest != manifest.files[rel].digest:
            problems[rel] = f"{tree / rel} was modified (its content differs from the build's)"
        else:
            moved[rel] = _entry(st, digest)
    regular = unread
    verified: dict[str | Path, tuple[os.stat_result, str]] = {}
    for rel, now in zip(regular, _digests([tree / rel for rel in regular]), strict=True):
        if isinstance(now, OSError):
            problems[rel] = f"{tree / rel} was modified (it cannot be read: {now.strerror})"
        elif now != manifest.files[rel].digest:
            kind = "bytecode" if _is_bytecode(rel) else "content"
            problems[rel] = f"{tree / rel} was modified (its {kind} differs from the build's)"
        else:
            moved[rel] = _entry(found.files[rel], now)
            if sealed is not None and found.files[rel].st_nlink > 1:
                # A file other environments hold too (the store's), verified as it is: its next reader need not.
                verified[tree / rel] = (found.files[rel], now)
    if sealed is not None and verified:
        sealed.seal(verified)
    if moved and not problems:
        try:
            _write(env_dir, tree, {**manifest.files, **moved}, manifest.links)
        except OSError:
            pass  # a read-only cache: the next check hashes those files again, nothing worse
    return [problems[rel] for rel in sorted(problems)]


def describe(problems: list[str]) -> str:
    more = f" (and {len(problems) - SHOWN} more)" if len(problems) > SHOWN else ""
    return "; ".join(problems[:SHOWN]) + more
