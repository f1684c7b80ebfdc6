"""Bytecode in an environment: compiled by the imports that need it, once per (interpreter, source),
placed in from a shared store and listed in the environment's manifest like any other file.

An environment is built without bytecode and nothing run in it writes any (``NO_BYTECODE_PTH``). Its
cell's worker and ranks keep what their imports compiled in ``<cache>/store/bytecode/<interpreter>/``
(``repros/runtime/bytecode.py``: a checked-hash ``.pyc`` named by the SHA-256 of its source and of
itself). ``place`` puts a stored ``.pyc`` (a hard link) where Python looks for it, beside every source
of the environment that has none yet and whose content one was compiled from, and adds it to the
manifest: at the end of a build (what other environments' items already compiled) and after items
(what they compiled, for the next start). Before a stored ``.pyc`` is linked, its content is checked
against its name and its header against the interpreter: one edited in place since is removed and
compiled again by the next import, never spread. Once placed, the manifest vouches for it like for
any other file (an edit is damage, a ``.pyc`` no one placed is damage).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from harness.environments.integrity import add_files, changing, listed
from repros.runtime.bytecode import (
    CHECKED_HASH_FLAGS,
    HEADER_BYTES,
    NO_BYTECODE_LINE,
    NO_BYTECODE_PTH,
    parse_entry_name,
)

BYTECODE = "bytecode"
#: The interpreter's cache tag and magic number, as ``repros.runtime.bytecode.interpreter_tag`` names them.
_TAG_PROBE = (
    "import importlib.util, json, sys; "
    "print(json.dumps([sys.implementation.cache_tag, importlib.util.MAGIC_NUMBER.hex()]))"
)


def store_dir(cache_dir: Path) -> Path:
    """The root of the bytecode store (what ``$FT_REGRESS_BYTECODE_STORE`` names)."""
    return cache_dir / "store" / BYTECODE


def interpreter_of(python: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The store's directory name for ``python``'s bytecode (``cpython-311-a70d0d0a``); None where it
    cannot say (then nothing is placed: its modules compile at import, as without a store)."""
    try:
        out = subprocess.run(
            [python, "-I", "-c", _TAG_PROBE], capture_output=True, text=True, env=environ, timeout=60, check=False
        )
        tag, magic = json.loads(out.stdout)
    except (OSError, subprocess.TimeoutExpired, ValueError, TypeError):
        return None
    if not isinstance(tag, str) or not isinstance(magic, str) or not tag:
        return None
    return f"{tag}-{magic}"


def write_no_bytecode(site_packages: Path) -> Path:
    """The ``.pth`` file that keeps every Python run in the environment from writing bytecode into it."""
    path = site_packages / NO_BYTECODE_PTH
    path.write_text(NO_BYTECODE_LINE, encoding="utf-8")
    return path


def _pyc_path(source: str, cache_tag: str) -> str:
    """Where Python looks for ``source``'s bytecode (``importlib.util.cache_from_source``, for the
    environment's interpreter and no optimisation)."""
    rel = PurePosixPath(source)
    return str(rel.parent / "__pycache__" / f"{rel.stem}.{cache_tag}.pyc")


@dataclass(frozen=True)
class Placed:
    files: int
    #: Stored ``.pyc`` files found damaged (content not what their name says) and removed.
    removed: int = 0


def _stored(directory: Path) -> dict[str, list[str]]:
    """The store's entries for one interpreter, by the digest of their source."""
    found: dict[str, list[str]] = {}
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return {}
    for name in names:
        parsed = parse_entry_name(name)
        if parsed is not None:
            found.setdefault(parsed[0], []).append(name)
    return found


def _sound(path: Path, digest: str, magic: bytes) -> bool:
    """Whether a stored ``.pyc`` still holds what its name says, for this interpreter."""
    try:
        data = path.read_bytes()
    except OSError:
        return False
    return (
        len(data) > HEADER_BYTES
        and data[:4] == magic
        and int.from_bytes(data[4:8], "little") == CHECKED_HASH_FLAGS
        and hashlib.sha256(data).hexdigest() == digest
    )


def _link_stored(tree: Path, wanted: Mapping[str, str], directory: Path, magic: bytes) -> tuple[dict[str, str], int]:
    """Link a stored ``.pyc`` at each ``wanted`` place (relative path -> its source's digest) where the
    store has one for that source and nothing is there yet. Returns what was linked (relative path ->
    the ``.pyc``'s digest) and how many stored entries were found damaged (and removed)."""
    stored = _stored(directory)
    added: dict[str, str] = {}
    removed = 0
    for pyc, source in wanted.items():
        for name in stored.get(source, ()):
            entry = directory / name
            pyc_digest = name.split(".")[1]
            if not _sound(entry, pyc_digest, magic):
                entry.unlink(missing_ok=True)  # damaged since it was stored: never spread
                removed += 1
                continue
            target = tree / pyc
            try:
                target.parent.mkdir(exist_ok=True)
                # Never over a file already there: one no manifest lists is damage for the check to name.
                os.link(entry, target)
            except OSError:
                break  # there already, another filesystem, a link limit: compiled at import instead
            added[pyc] = pyc_digest
            break
    return added, removed


def place_in_tree(tree: Path, store: Path, interpreter: str) -> Placed:
    """During a build, before any manifest: link a stored ``.pyc`` beside every source of ``tree`` that
    has none and whose content one was compiled from (so that the build's own imports, DeepSpeed's
    setup importing torch, compile nothing already compiled). The manifest lists them like the rest."""
    cache_tag, _, magic_hex = interpreter.rpartition("-")
    directory = store / interpreter
    if not directory.is_dir():
        return Placed(0)
    wanted: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(tree):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in filenames:
            if not name.endswith(".py"):
                continue
            source = Path(dirpath) / name
            rel = source.relative_to(tree).as_posix()
            pyc = _pyc_path(rel, cache_tag)
            if (tree / pyc).exists():
                continue
            try:
                with open(source, "rb") as fh:
                    wanted[pyc] = hashlib.file_digest(fh, "sha256").hexdigest()
            except OSError:
                continue
    added, removed = _link_stored(tree, wanted, directory, bytes.fromhex(magic_hex))
    return Placed(len(added), removed)


def place(env_dir: Path, store: Path, interpreter: str, ready: bool = True) -> Placed:
    """Link every stored ``.pyc`` of a source the environment holds (by its content, as its manifest
    lists it) where Python looks for it, where the environment has none yet, and list it in the
    manifest. ``ready``: the environment is in use (checks may run): the change is made while no
    check runs (``integrity.changing``)."""
    found = listed(env_dir)
    if found is None:
        return Placed(0)
    tree, files = found
    cache_tag, _, magic_hex = interpreter.rpartition("-")
    wanted = {
        pyc: entry.digest
        for rel, entry in files.items()
        if rel.endswith(".py") and (pyc := _pyc_path(rel, cache_tag)) not in files
    }
    if not wanted:
        return Placed(0)
    with changing(env_dir) if ready else nullcontext():
        added, removed = _link_stored(tree, wanted, store / interpreter, bytes.fromhex(magic_hex))
        if added:
            add_files(env_dir, added)
    return Placed(len(added), removed)
