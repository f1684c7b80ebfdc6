"""Bytecode compiled once, by the imports that need it, and kept for every environment.

A cell's environment is built without bytecode, and nothing run in it writes any (a ``.pth`` file
the build puts in its ``site-packages`` sets ``sys.dont_write_bytecode``): a ``.pyc`` Python would
load instead of its source is the environment's content like any other file, listed in its
manifest. When the orchestrator asks for it (``$FT_REGRESS_BYTECODE_STORE``), the cell's worker and
its ranks keep what their imports compiled: each module of the environment compiled from its source
is written, as the checked-hash ``.pyc`` Python itself would have written (PEP 552: the magic number,
the flags, the source's hash, the marshalled code), into a store keyed by the interpreter and the
SHA-256 of the source. The orchestrator places them from there into every environment holding the
same source, once the environment's own interpreter has verified each against the source it goes beside
(``python bytecode.py --verify``: ``compiled_from``, the code compiled afresh and compared), lists them in
its manifest, and checks them like the rest (``harness/environments/bytecode.py``). A module no item
imports is never compiled; one that several environments hold is compiled once (and compiled again
once per environment it is placed in, to verify it).

Python validates a checked-hash ``.pyc``'s header against its source at every import, never its code,
and rewrites the code's file names to the path it was loaded from, so one compiled in one environment
serves another, and one whose code is not its source's would run unnoticed: hence the verification.

Only the standard library is imported here.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import importlib.machinery
import importlib.util
import json
import marshal
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from types import CodeType
from typing import Any

#: Where a process keeps what it compiles (the store's root); unset: nothing is kept.
STORE_VARIABLE = "FT_REGRESS_BYTECODE_STORE"
#: PEP 552's flags of a hash-based ``.pyc`` whose source is checked at every import.
CHECKED_HASH_FLAGS = 0b11
#: The header: magic number, flags, source hash.
HEADER_BYTES = 16
#: What a build puts in ``site-packages``: no Python run in the environment writes bytecode into it.
NO_BYTECODE_PTH = "_ft_regress_no_bytecode.pth"
NO_BYTECODE_LINE = "import sys; sys.dont_write_bytecode = True\n"


def interpreter_tag(cache_tag: str | None = None, magic: bytes | None = None) -> str:
    """The store's directory for an interpreter's bytecode: its cache tag and magic number
    (``cpython-311-a70d0d0a``); this interpreter's where none are given."""
    tag = cache_tag if cache_tag is not None else sys.implementation.cache_tag
    return f"{tag}-{(magic if magic is not None else importlib.util.MAGIC_NUMBER).hex()}"


def entry_name(source_digest: str, pyc_digest: str) -> str:
    """A stored ``.pyc``: the SHA-256 of its source, then that of its own content (what it is checked by)."""
    return f"{source_digest}.{pyc_digest}.pyc"


def parse_entry_name(name: str) -> tuple[str, str] | None:
    """(source digest, content digest) of a stored ``.pyc``'s name; None for anything else."""
    parts = name.split(".")
    if len(parts) != 3 or parts[2] != "pyc" or len(parts[0]) != 64 or len(parts[1]) != 64:
        return None
    return parts[0], parts[1]


def hash_pyc(source: bytes, code: CodeType) -> bytes:
    """The checked-hash ``.pyc`` of ``code`` compiled from ``source``, as ``py_compile`` writes it."""
    flags = CHECKED_HASH_FLAGS.to_bytes(4, "little")
    return importlib.util.MAGIC_NUMBER + flags + importlib.util.source_hash(source) + marshal.dumps(code)


def compiled_from(source: bytes, data: bytes, path: str = "<source>") -> bool:
    """Whether ``data`` is the checked-hash ``.pyc`` this interpreter compiles from ``source``: its header (magic
    number, flags, the source's hash) and its code, compared with the code compiled afresh from ``source`` (code
    objects compare equal whatever file name they were compiled under). A ``.pyc`` whose header names a source
    but whose code is another's (Python checks only the header at import) is not."""
    if len(data) <= HEADER_BYTES or data[:4] != importlib.util.MAGIC_NUMBER:
        return False
    if int.from_bytes(data[4:8], "little") != CHECKED_HASH_FLAGS or data[8:16] != importlib.util.source_hash(source):
        return False
    try:
        stored = marshal.loads(data[HEADER_BYTES:])
        fresh = compile(source, path, "exec", dont_inherit=True)
    except (ValueError, EOFError, TypeError, SyntaxError):
        return False
    return isinstance(stored, CodeType) and stored == fresh


#: What verifying a stored ``.pyc`` against a source found: compiled from it; the source no longer what its
#: digest says (nothing to say of the ``.pyc``); the ``.pyc`` not what its name says, or not compiled from it.
COMPILED, SOURCE_CHANGED, NOT_COMPILED_FROM = "compiled", "source changed", "not compiled from it"


def _verified_pair(pair: list[str]) -> str:
    """(source path, its SHA-256, stored ``.pyc`` path, its SHA-256): what the ``.pyc`` is to the source."""
    source_path, source_digest, pyc_path, pyc_digest = pair
    try:
        with open(source_path, "rb") as fh:
            source = fh.read()
    except OSError:
        return SOURCE_CHANGED
    if hashlib.sha256(source).hexdigest() != source_digest:
        return SOURCE_CHANGED
    try:
        with open(pyc_path, "rb") as fh:
            data = fh.read()
    except OSError:
        return NOT_COMPILED_FROM
    if hashlib.sha256(data).hexdigest() != pyc_digest or not compiled_from(source, data, source_path):
        return NOT_COMPILED_FROM
    return COMPILED


def verify_main(lines: list[str]) -> list[str]:
    """What ``python bytecode.py --verify`` prints for the pairs (one JSON list per line) on its standard input:
    what each stored ``.pyc`` is to its source (``COMPILED``...), for this interpreter, on every core."""
    pairs = [json.loads(line) for line in lines if line.strip()]
    workers = min(len(pairs) // 64 + 1, os.cpu_count() or 1, 8)
    if workers <= 1:
        return [_verified_pair(pair) for pair in pairs]
    with concurrent.futures.ProcessPoolExecutor(workers) as pool:
        return list(pool.map(_verified_pair, pairs, chunksize=32))


class _Keeper:
    """Writes what this process compiles from the environment's sources into the store, once each."""

    def __init__(self, store: Path, prefix: str) -> None:
        self.directory = store / interpreter_tag()
        self.prefix = prefix
        self.pid = os.getpid()
        self.known: set[str] = set()
        self.listed = False

    def keep(self, source: bytes, path: str, code: CodeType) -> None:
        if not path.startswith(self.prefix):
            return  # the standard library, the harness's own code: not the environment's
        try:
            if not self.listed or self.pid != os.getpid():  # a forked rank lists the store afresh
                self.directory.mkdir(parents=True, exist_ok=True)
                found = (parse_entry_name(name) for name in os.listdir(self.directory))
                self.known = {entry[0] for entry in found if entry}
                self.listed, self.pid = True, os.getpid()
            digest = hashlib.sha256(source).hexdigest()
            if digest in self.known:
                return
            data = hash_pyc(source, code)
            final = self.directory / entry_name(digest, hashlib.sha256(data).hexdigest())
            partial = self.directory / f".{final.name}.{os.getpid()}.tmp"
            partial.write_bytes(data)
            try:
                os.link(partial, final)  # whole or absent; the first writer of an entry wins
            except FileExistsError:
                pass
            finally:
                partial.unlink()
            self.known.add(digest)
        except (OSError, ValueError):
            pass  # a full disk, a read-only cache: the module is imported all the same


_KEEPER: list[_Keeper] = []


def _keeping_source_loader(fullname: str, path: str) -> importlib.machinery.SourceFileLoader:
    """Python's own loader of a ``.py`` file, which also keeps what it compiles."""
    loader = importlib.machinery.SourceFileLoader(fullname, path)
    compile_source = loader.source_to_code

    def source_to_code(data: Any, source_path: Any, *, _optimize: int = -1) -> CodeType:
        code = compile_source(data, source_path, _optimize=_optimize)
        if isinstance(data, bytes) and isinstance(source_path, str) and _optimize == -1 and not sys.flags.optimize:
            for keeper in _KEEPER:
                keeper.keep(data, source_path, code)
        return code

    setattr(loader, "source_to_code", source_to_code)  # noqa: B010 - an instance's own, not the class's
    return loader


def keep_compiled(environ: Mapping[str, str] = os.environ) -> bool:
    """Where ``$FT_REGRESS_BYTECODE_STORE`` names a store, keep in it every module of this
    interpreter's environment (``sys.prefix``) that this process compiles from its source from now
    on (forked children included). True where it is kept; idempotent."""
    store = environ.get(STORE_VARIABLE)
    if not store or sys.prefix == sys.base_prefix:
        return False  # no store, or not a virtual environment: nothing of its own to keep
    if not _KEEPER:
        _KEEPER.append(_Keeper(Path(store), os.path.join(sys.prefix, "")))
        loaders: list[tuple[Any, list[str]]] = [
            (importlib.machinery.ExtensionFileLoader, importlib.machinery.EXTENSION_SUFFIXES),
            (_keeping_source_loader, importlib.machinery.SOURCE_SUFFIXES),
            (importlib.machinery.SourcelessFileLoader, importlib.machinery.BYTECODE_SUFFIXES),
        ]
        sys.path_hooks.insert(0, importlib.machinery.FileFinder.path_hook(*loaders))
        sys.path_importer_cache.clear()
    return True


if __name__ == "__main__" and sys.argv[1:] == ["--verify"]:
    print(json.dumps(verify_main(sys.stdin.read().splitlines())))
