"""The check before and after every item reads an environment's manifest once per version of the
file: a manifest written again (by a refresh, a rebuild, another process) is read again, so what the
check compares with is always what is on disk."""

from __future__ import annotations

import json
import os
from pathlib import Path

from harness.environments import integrity
from harness.environments.integrity import MANIFEST, damage, write_manifest


def tree_with(tmp_path: Path, files: dict[str, str]) -> tuple[Path, Path]:
    env_dir, tree = tmp_path / "env", tmp_path / "env" / "venv"
    for rel, text in files.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
    return env_dir, tree


def test_a_manifest_is_parsed_once_while_it_is_unchanged(tmp_path: Path, monkeypatch) -> None:
    env_dir, tree = tree_with(tmp_path, {"a.py": "a = 1\n", "pkg/b.py": "b = 2\n"})
    write_manifest(env_dir, tree)
    parsed: list[Path] = []
    real = integrity._parse
    monkeypatch.setattr(integrity, "_parse", lambda path: parsed.append(path) or real(path))
    integrity._READ.clear()
    assert damage(env_dir) == [] and damage(env_dir) == [] and damage(env_dir) == []
    assert parsed == [env_dir / MANIFEST]


def test_a_manifest_written_by_another_process_is_read_again(tmp_path: Path) -> None:
    env_dir, tree = tree_with(tmp_path, {"a.py": "a = 1\n", "b.py": "b = 2\n"})
    write_manifest(env_dir, tree)
    assert damage(env_dir) == []
    # Another process lists the tree without b.py (as if it were built so): this one must see it.
    payload = json.loads((env_dir / MANIFEST).read_text())
    del payload["files"]["b.py"]
    other = env_dir / "other.tmp"
    other.write_text(json.dumps(payload))
    os.replace(other, env_dir / MANIFEST)
    assert damage(env_dir) == [f"{tree / 'b.py'} was added"]


def test_an_edit_is_damage_though_the_manifest_was_read_before(tmp_path: Path) -> None:
    env_dir, tree = tree_with(tmp_path, {"a.py": "a = 1\n"})
    write_manifest(env_dir, tree)
    assert damage(env_dir) == []
    st = (tree / "a.py").stat()
    (tree / "a.py").write_text("a = 2\n")  # same size
    os.utime(tree / "a.py", ns=(st.st_atime_ns, st.st_mtime_ns))  # the modification time put back
    assert damage(env_dir) == [f"{tree / 'a.py'} was modified (its content differs from the build's)"]


def test_only_a_few_manifests_are_kept_in_memory(tmp_path: Path) -> None:
    integrity._READ.clear()
    for n in range(integrity._READ_KEPT + 3):
        env_dir, tree = tree_with(tmp_path / str(n), {"a.py": f"a = {n}\n"})
        write_manifest(env_dir, tree)
        assert damage(env_dir) == []
    assert len(integrity._READ) == integrity._READ_KEPT
