"""Which files of a new environment uv copied, unchanged, from which file of its own cache.

uv unpacks each wheel once into its cache (``archive-v*/<id>/``, the wheel's files under the paths
they take in ``site-packages``) and copies them into every environment that installs the wheel
(``--link-mode copy``). So the digest of such a file is the digest of the cache's file, which
needs hashing once (and is then sealed, ``seals.py``), not once per environment.

A distribution installed by uv is matched with the unpacked wheel it came from by its
``RECORD``: the wheel's own lines (each file, its claimed hash and size) are all in the installed
``RECORD``, which uv writes from them (adding only what it installs beside: ``INSTALLER``,
``REQUESTED``, scripts). ``RECORD``'s claimed hashes are never used as digests (some wheels' are
wrong): they only tell which unpacked wheel a distribution is. A distribution two unpacked wheels
could be, or none, is left out, as is any file whose size differs from the cache's: those are hashed.
"""

from __future__ import annotations

import csv
import os
import stat
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from harness.environments.seals import Seals

RECORD = "RECORD"


def _record_lines(dist_info: Path) -> set[str] | None:
    try:
        text = (dist_info / RECORD).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return {line.strip() for line in text.splitlines() if line.strip()}


def unpacked_wheels(uv_caches: Iterable[Path]) -> dict[str, list[Path]]:
    """Every unpacked wheel in ``uv_caches`` by the name of its ``.dist-info`` directory."""
    found: dict[str, list[Path]] = {}
    for cache in uv_caches:
        for archive_root in sorted(Path(cache).glob("archive-v*")):
            try:
                archives = list(os.scandir(archive_root))
            except OSError:
                continue
            for archive in archives:
                try:
                    entries = os.listdir(archive.path)
                except OSError:
                    continue
                for name in entries:
                    if name.endswith(".dist-info"):
                        found.setdefault(name, []).append(Path(archive.path))
    return found


def _wheel_of(dist_info: Path, candidates: Sequence[Path]) -> Path | None:
    """The one unpacked wheel among ``candidates`` whose ``RECORD`` lines are all the installed one's."""
    installed = _record_lines(dist_info)
    if installed is None:
        return None
    matches = []
    for archive in candidates:
        lines = _record_lines(archive / dist_info.name)
        if lines is not None and lines <= installed:
            matches.append(archive)
    return matches[0] if len(matches) == 1 else None


def copied_from(site: Path, uv_caches: Iterable[Path]) -> dict[str, Path]:
    """Each file of ``site`` (relative path) that uv copied from a file of its cache, and that file."""
    wheels = unpacked_wheels(uv_caches)
    sources: dict[str, Path] = {}
    for dist_info in sorted(site.glob("*.dist-info")):
        try:
            by_uv = (dist_info / "INSTALLER").read_text(encoding="utf-8").strip() == "uv"
        except OSError:
            by_uv = False
        archive = _wheel_of(dist_info, wheels.get(dist_info.name, [])) if by_uv else None
        if archive is None:
            continue
        with open(dist_info / RECORD, encoding="utf-8", errors="replace", newline="") as record:
            for row in csv.reader(record):
                rel = row[0] if row else ""
                if rel and not rel.startswith(("/", "..")) and ".." not in Path(rel).parts:
                    sources[rel] = archive / rel
    return sources


def known_digests(site: Path, sources: Mapping[str, Path], seals: Seals) -> dict[tuple[int, int], str]:
    """The digest of each file of ``site`` copied from ``sources`` (by its device and inode): the cache
    file's, sealed or hashed once, where both are regular files of the same size."""
    pairs: list[tuple[os.stat_result, str]] = []
    files: dict[str, os.stat_result] = {}
    base = str(site)
    for rel, source in sources.items():
        try:
            here, there = os.lstat(f"{base}/{rel}"), os.lstat(source)
        except OSError:
            continue
        if stat.S_ISREG(here.st_mode) and stat.S_ISREG(there.st_mode) and here.st_size == there.st_size:
            pairs.append((here, str(source)))
            files[str(source)] = there
    digests = seals.digests(files)
    known: dict[tuple[int, int], str] = {}
    for here, origin in pairs:
        digest = digests.get(origin)
        if isinstance(digest, str):
            known[(here.st_dev, here.st_ino)] = digest
    return known
