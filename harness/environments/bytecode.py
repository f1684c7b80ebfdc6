"""Bytecode in an environment: compiled by the imports that need it, once per (interpreter, source),
placed in from a shared store and listed in the environment's manifest like any other file.

An environment is built without bytecode and nothing run in it writes any (``NO_BYTECODE_PTH``). Its
cell's worker and ranks keep what their imports compiled in ``<cache>/store/bytecode/<interpreter>/``
(``repros/runtime/bytecode.py``: a checked-hash ``.pyc`` named by the SHA-256 of its source and of
itself). ``place`` puts a stored ``.pyc`` (a hard link) where Python looks for it, beside every source
of the environment that has none yet and whose content one was compiled from, and adds it to the
manifest: at the end of a build (what other environments' items already compiled) and after items
(what they compiled, for the next start). Before a stored ``.pyc`` is linked, its content is checked
against its name and its header against the interpreter, and then the environment's own interpreter
verifies it against the source it goes beside (``python repros/runtime/bytecode.py --verify``: the
source compiled afresh, the code compared): its name is what any writer of the store says, not proof.
One that is not what its name says is removed and compiled again by the next import, never spread; one
that could not be verified (the interpreter did not answer) is not placed. Only then does the manifest
vouch for it like for any other file (an edit is damage, a ``.pyc`` no one placed is damage).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import threading
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from harness.environments.integrity import add_files, changing, listed
from repros.runtime import bytecode as runtime_bytecode
from repros.runtime.bytecode import (
    CHECKED_HASH_FLAGS,
    COMPILED,
    HEADER_BYTES,
    NO_BYTECODE_LINE,
    NO_BYTECODE_PTH,
    NOT_COMPILED_FROM,
    parse_entry_name,
)

BYTECODE = "bytecode"
#: How long an environment's interpreter may take to verify what is placed (it compiles each source again).
VERIFY_TIMEOUT_S = 1800.0
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


@dataclass(frozen=True)
class _Candidate:
    """A stored ``.pyc`` to place: where it goes (relative to the tree), the source beside it, their digests."""

    pyc: str
    source: str
    source_digest: str
    entry: Path
    pyc_digest: str


#: (interpreter, stored entry's name) this process's verifications found compiled from their source: a name
#: holds both digests, so what was verified once (its content re-checked against the name) is verified for good.
_VERIFIED: set[tuple[str, str]] = set()
_VERIFIED_LOCK = threading.Lock()


def _verify(python: Path, tree: Path, candidates: Sequence[_Candidate]) -> dict[str, str] | None:
    """What each candidate's ``.pyc`` is to the source it goes beside (``COMPILED``, ``SOURCE_CHANGED``,
    ``NOT_COMPILED_FROM``), by entry name, as ``python`` finds it (the environment's own interpreter compiles
    each source again: ``repros/runtime/bytecode.py``); None where it gave no answer (nothing is placed then)."""
    known = {c.entry.name: COMPILED for c in candidates if (c.entry.parent.name, c.entry.name) in _VERIFIED}
    asked = [c for c in candidates if c.entry.name not in known]
    if not asked:
        return known
    pairs = "".join(
        json.dumps([str(tree / c.source), c.source_digest, str(c.entry), c.pyc_digest]) + "\n" for c in asked
    )
    try:
        out = subprocess.run(
            [str(python), "-I", "-B", str(Path(runtime_bytecode.__file__)), "--verify"],
            input=pairs,
            capture_output=True,
            text=True,
            timeout=VERIFY_TIMEOUT_S,
            check=False,
        )
        answers = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        answers = None
    if not isinstance(answers, list) or len(answers) != len(asked):
        return None
    verdicts = {**known, **{c.entry.name: str(answer) for c, answer in zip(asked, answers, strict=True)}}
    with _VERIFIED_LOCK:
        _VERIFIED.update((c.entry.parent.name, c.entry.name) for c in asked if verdicts[c.entry.name] == COMPILED)
    return verdicts


def _verified_candidates(
    tree: Path, wanted: Mapping[str, tuple[str, str]], directory: Path, magic: bytes, python: Path
) -> tuple[list[_Candidate], int]:
    """The stored ``.pyc`` for each ``wanted`` place (relative path -> its source's relative path and digest)
    that the store has for that source and ``python`` verified was compiled from it, and how many stored
    entries were found not to be what their name says (and removed)."""
    stored = _stored(directory)
    removed = 0
    candidates: list[_Candidate] = []
    for pyc, (source, source_digest) in wanted.items():
        for name in stored.get(source_digest, ()):
            entry = directory / name
            pyc_digest = name.split(".")[1]
            if not _sound(entry, pyc_digest, magic):
                entry.unlink(missing_ok=True)  # damaged since it was stored: never spread
                removed += 1
                continue
            candidates.append(_Candidate(pyc, source, source_digest, entry, pyc_digest))
            break
    verdicts = _verify(python, tree, candidates) if candidates else {}
    if verdicts is None:
        return [], removed  # not verified: compiled at import instead
    verified = []
    for candidate in candidates:
        verdict = verdicts.get(candidate.entry.name)
        if verdict == COMPILED:
            verified.append(candidate)
        elif verdict == NOT_COMPILED_FROM:
            candidate.entry.unlink(missing_ok=True)  # not compiled from the source its name says: never spread
            removed += 1
        # SOURCE_CHANGED: the environment's source is not what its manifest says (the check names it): not placed
    return verified, removed


def _link(tree: Path, candidates: Sequence[_Candidate]) -> dict[str, str]:
    """Link each verified ``.pyc`` where it goes, where nothing is there yet: what was linked (relative path ->
    the ``.pyc``'s digest)."""
    added: dict[str, str] = {}
    for candidate in candidates:
        target = tree / candidate.pyc
        try:
            target.parent.mkdir(exist_ok=True)
            # Never over a file already there: one no manifest lists is damage for the check to name.
            os.link(candidate.entry, target)
        except OSError:
            continue  # there already, another filesystem, a link limit: compiled at import instead
        added[candidate.pyc] = candidate.pyc_digest
    return added


def place_in_tree(tree: Path, store: Path, interpreter: str, python: Path | None = None) -> Placed:
    """During a build, before any manifest: link a stored ``.pyc`` beside every source of ``tree`` that
    has none and whose content one was compiled from (so that the build's own imports, DeepSpeed's
    setup importing torch, compile nothing already compiled). The manifest lists them like the rest.
    ``python``: the environment's interpreter, which verifies them (default: the tree's ``bin/python``)."""
    cache_tag, _, magic_hex = interpreter.rpartition("-")
    directory = store / interpreter
    if not directory.is_dir():
        return Placed(0)
    wanted: dict[str, tuple[str, str]] = {}
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
                    wanted[pyc] = (rel, hashlib.file_digest(fh, "sha256").hexdigest())
            except OSError:
                continue
    magic = bytes.fromhex(magic_hex)
    verified, removed = _verified_candidates(tree, wanted, directory, magic, python or _python_of(tree))
    return Placed(len(_link(tree, verified)), removed)


def _python_of(tree: Path) -> Path:
    """A virtual environment's own interpreter."""
    return tree / "bin" / "python"


def place(env_dir: Path, store: Path, interpreter: str, ready: bool = True, python: Path | None = None) -> Placed:
    """Link every stored ``.pyc`` of a source the environment holds (by its content, as its manifest
    lists it) where Python looks for it, where the environment has none yet, and list it in the
    manifest. ``ready``: the environment is in use (checks may run): the change is made while no
    check runs (``integrity.changing``). ``python``: the environment's interpreter, which verifies each
    against its source (default: the tree's ``bin/python``)."""
    found = listed(env_dir)
    if found is None:
        return Placed(0)
    tree, files = found
    cache_tag, _, magic_hex = interpreter.rpartition("-")
    wanted = {
        pyc: (rel, entry.digest)
        for rel, entry in files.items()
        if rel.endswith(".py") and (pyc := _pyc_path(rel, cache_tag)) not in files
    }
    if not wanted:
        return Placed(0)
    magic = bytes.fromhex(magic_hex)
    # Verified before the manifest is held: a check waits for the links and the listing only.
    verified, removed = _verified_candidates(tree, wanted, store / interpreter, magic, python or _python_of(tree))
    with changing(env_dir) if ready else nullcontext():
        added = _link(tree, verified)
        if added:
            add_files(env_dir, added)
    return Placed(len(added), removed)
