"""Bytecode is compiled by the imports that need it, once per (interpreter, source): what one
environment's items compiled is placed into every environment holding the same source, listed in
its manifest and checked like any other file; a stored ``.pyc`` damaged since is never spread; and
a check running while bytecode is placed never sees a file its manifest does not list yet."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import threading
from pathlib import Path

from harness.environments.bytecode import place
from harness.environments.integrity import MANIFEST, damage, write_manifest
from repros.runtime.bytecode import entry_name, hash_pyc, interpreter_tag
from tests.environments.test_environments import REQUEST
from tests.environments.test_integrity import RealTreeBuilds, cached_pyc, imported_lora, site


def stored(store: Path) -> list[Path]:
    return sorted((store / interpreter_tag()).glob("*.pyc"))


def listed(env_dir: Path) -> set[str]:
    return set(json.loads((env_dir / MANIFEST).read_text())["files"])


def test_what_one_environments_import_compiled_is_placed_in_another_with_the_same_source(tmp_path: Path) -> None:
    builds = RealTreeBuilds(tmp_path)
    first = builds.get(REQUEST)
    assert not list(site(first).rglob("*.pyc"))  # built without bytecode
    assert imported_lora(first, keep=builds.bytecode_store) == "lora"  # an item's import: compiled, kept
    kept = stored(builds.bytecode_store)
    assert len(kept) == 2  # peft/__init__.py and peft/tuners.py, nothing else of the environment
    assert builds.verify(first) == []  # and placed into the environment that compiled it, listed
    tuners = cached_pyc(site(first) / "peft" / "tuners.py")
    assert tuners.is_file() and str(tuners.relative_to(Path(first.python).parent.parent)) in listed(Path(first.path))
    # Another environment holding the same sources gets them at its build: nothing compiles them again.
    second = builds.get(dataclasses.replace(REQUEST, exclude_newer="2999-01-01"))
    assert second.key != first.key
    placed = cached_pyc(site(second) / "peft" / "tuners.py")
    assert placed.is_file() and os.path.samefile(placed, tuners)
    assert builds.verify(second) == []
    assert imported_lora(second, keep=builds.bytecode_store) == "lora"
    assert stored(builds.bytecode_store) == kept  # its import compiled nothing


def test_a_stored_pyc_damaged_since_is_never_placed(tmp_path: Path) -> None:
    builds = RealTreeBuilds(tmp_path)
    first = builds.get(REQUEST)
    imported_lora(first, keep=builds.bytecode_store)
    for entry in stored(builds.bytecode_store):
        data = bytearray(entry.read_bytes())
        data[-1] ^= 0xFF  # edited in place: every environment holding it sees its content differ
        entry.write_bytes(bytes(data))
    second = builds.get(dataclasses.replace(REQUEST, exclude_newer="2999-01-01"))
    assert not list(site(second).rglob("*.pyc"))
    assert stored(builds.bytecode_store) == []  # removed: the next import compiles and keeps it again
    assert imported_lora(second, keep=builds.bytecode_store) == "lora"
    assert len(stored(builds.bytecode_store)) == 2


def test_a_check_never_sees_bytecode_being_placed_as_damage(tmp_path: Path) -> None:
    env_dir = tmp_path / "env"
    tree = env_dir / "venv"
    sources = {f"pkg/m{i:03d}.py": f"VALUE = {i}\n".encode() for i in range(300)}
    for rel, text in sources.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_bytes(text)
    write_manifest(env_dir, tree)
    store = tmp_path / "store"
    directory = store / interpreter_tag()
    directory.mkdir(parents=True)
    for rel, text in sources.items():
        data = hash_pyc(text, compile(text, rel, "exec", dont_inherit=True))
        (directory / entry_name(hashlib.sha256(text).hexdigest(), hashlib.sha256(data).hexdigest())).write_bytes(data)
    seen: list[list[str]] = []
    stop = threading.Event()

    def check() -> None:
        while not stop.is_set():
            seen.append(damage(env_dir))

    checker = threading.Thread(target=check)
    checker.start()
    try:
        placed = place(env_dir, store, interpreter_tag(), python=Path(sys.executable))
    finally:
        stop.set()
        checker.join()
    assert placed.files == len(sources)
    assert seen and all(problems == [] for problems in seen), next(p for p in seen if p)
    assert damage(env_dir) == [] and len(list(tree.rglob("*.pyc"))) == len(sources)
