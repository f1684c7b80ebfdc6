"""The cache trusts nothing it did not verify (issue 50, class 3): a cache moved or copied is never run from, judged
by or written into the original's environments; a stored ``.pyc`` is placed only once the environment's own
interpreter has verified it was compiled from the source it goes beside, and never vouched for otherwise."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from harness.environments.bytecode import place
from harness.environments.integrity import MANIFEST, damage, write_manifest
from repros.runtime.bytecode import compiled_from, entry_name, hash_pyc, interpreter_tag
from tests.environments.test_environments import REQUEST
from tests.environments.test_integrity import MODULES, RealTreeBuilds, cached_pyc, imported_lora, site


def _forge(store: Path, source: str, code_of: str) -> Path:
    """A store entry whose name and header say ``source`` and whose code is ``code_of``'s (what any writer of the
    store can make: Python checks the header against the source at import, never the code)."""
    text = source.encode()
    data = hash_pyc(text, compile(code_of, "tuners.py", "exec", dont_inherit=True))  # the header: the source's hash
    directory = store / interpreter_tag()
    directory.mkdir(parents=True, exist_ok=True)
    entry = directory / entry_name(hashlib.sha256(text).hexdigest(), hashlib.sha256(data).hexdigest())
    entry.write_bytes(data)
    return entry


def test_a_stored_pyc_not_compiled_from_its_source_is_never_placed_nor_vouched_for(tmp_path: Path) -> None:
    builds = RealTreeBuilds(tmp_path)
    forged = _forge(builds.bytecode_store, MODULES["peft/tuners.py"], "LORA = 'pwnd'\n")
    env = builds.get(REQUEST)
    tuners = cached_pyc(site(env) / "peft" / "tuners.py")
    assert not tuners.exists()  # not placed
    listed = json.loads((Path(env.path) / MANIFEST).read_text())["files"]
    assert not [rel for rel in listed if rel.endswith(".pyc")]  # nor listed
    assert not forged.exists()  # and removed from the store: never spread to the next environment
    assert imported_lora(env, keep=builds.bytecode_store) == "lora"  # the source's own code, compiled and kept
    again = builds.get(dataclasses.replace(REQUEST, exclude_newer="2999-01-01"))
    assert cached_pyc(site(again) / "peft" / "tuners.py").is_file()  # what was compiled from it is shared
    assert imported_lora(again) == "lora"


def test_the_check_compares_the_code_not_the_header() -> None:
    source = MODULES["peft/tuners.py"].encode()
    honest = hash_pyc(source, compile(source, "tuners.py", "exec", dont_inherit=True))
    assert compiled_from(source, honest, "/elsewhere/peft/tuners.py")  # whatever path it was compiled under
    other = hash_pyc(source, compile(b"LORA = 'pwnd'\n", "tuners.py", "exec", dont_inherit=True))
    assert other[8:16] == honest[8:16] and not compiled_from(source, other)


def test_a_pyc_placed_beside_a_source_edited_since_is_not_placed_and_the_entry_is_kept(tmp_path: Path) -> None:
    env_dir, tree = tmp_path / "env", tmp_path / "env" / "venv"
    (tree / "pkg").mkdir(parents=True)
    text = b"VALUE = 1\n"
    (tree / "pkg" / "m.py").write_bytes(text)
    write_manifest(env_dir, tree)
    directory = tmp_path / "store" / interpreter_tag()
    directory.mkdir(parents=True)
    data = hash_pyc(text, compile(text, "m.py", "exec", dont_inherit=True))
    entry = directory / entry_name(hashlib.sha256(text).hexdigest(), hashlib.sha256(data).hexdigest())
    entry.write_bytes(data)
    (tree / "pkg" / "m.py").write_bytes(b"VALUE = 2\n")  # damage: the check names it, the entry is not at fault
    placed = place(env_dir, tmp_path / "store", interpreter_tag(), python=Path(sys.executable))
    assert placed.files == 0 and entry.exists()


# -- a cache moved or copied ----------------------------------------------------------------------------------------


def _copy_linked(source: Path, target: Path) -> None:
    """``cp -al``: every file a hard link, as a CI cache restored or a copy made to save space."""
    subprocess.run(["cp", "-al", str(source), str(target)], check=True)


def test_a_copied_cache_never_uses_the_originals_environments(tmp_path: Path) -> None:
    original = tmp_path / "original"
    first = RealTreeBuilds(original).get(REQUEST)
    copy = tmp_path / "copy"
    _copy_linked(original, copy)
    copied_env = copy / "envs" / first.key
    problems = damage(copied_env)
    assert problems and f"it was built in {Path(first.path) / 'venv'}"[:-5] in problems[0], problems
    assert "a cache moved or copied" in problems[0]
    store_before = sorted(p.name for p in (original / "store").rglob("*"))
    builds = RealTreeBuilds(copy)
    env = builds.get(REQUEST)
    assert builds.builds == 1 and not env.reused  # built again where the copy is
    assert env.repaired is not None and "a cache moved or copied" in env.repaired
    assert Path(env.python).is_relative_to(copy) and env.bytecode_store is not None
    assert Path(env.bytecode_store).is_relative_to(copy)
    assert builds.verify(env) == [] and damage(Path(env.path)) == []
    assert sorted(p.name for p in (original / "store").rglob("*")) == store_before  # nothing written there
    assert damage(Path(first.path)) == []  # and the original is as it was


def test_a_moved_cache_is_rebuilt_saying_it_moved(tmp_path: Path) -> None:
    original = tmp_path / "original"
    first = RealTreeBuilds(original).get(REQUEST)
    moved = tmp_path / "moved"
    shutil.move(original, moved)
    problems = damage(moved / "envs" / first.key)
    assert problems and "a cache moved or copied" in problems[0]
    env = RealTreeBuilds(moved).get(REQUEST)
    assert not env.reused and env.repaired is not None and "a cache moved or copied" in env.repaired
    assert Path(env.python).is_relative_to(moved)
    assert os.path.isfile(env.python)
