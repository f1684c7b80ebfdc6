"""Is a built environment still what was built? A manifest of its files, checked cheaply.

At the end of a build every file of the environment's interpreter tree is listed with its size
and modification time (``manifest.json``). Before an environment is reused, and after every item
that ran in it, the tree is walked again and compared (a stat per file: about 0.3 s for a torch
environment here): a file edited, added or removed is damage, named in the reason. Python's own
bytecode caches (``__pycache__``) change on import and are not listed.

The environment's files are copies (uv's ``--link-mode copy``), never hard links into uv's cache,
so an edit in one environment cannot reach the cache, a rebuild, or another environment.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

MANIFEST = "manifest.json"
#: The most differences a reason names.
SHOWN = 5


def _walk(root: Path) -> dict[str, tuple[int, int]]:
    found: dict[str, tuple[int, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in filenames:
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            found[os.path.relpath(path, root)] = (st.st_size, st.st_mtime_ns)
    return found


def write_manifest(env_dir: Path, tree: Path) -> int:
    """List ``tree``'s files in ``env_dir/manifest.json``; return how many."""
    files = _walk(tree)
    payload = {"tree": str(tree), "files": {k: list(v) for k, v in sorted(files.items())}}
    tmp = env_dir / f"{MANIFEST}.tmp"
    tmp.write_text(json.dumps(payload, separators=(",", ":")), encoding="utf-8")
    os.replace(tmp, env_dir / MANIFEST)
    return len(files)


def damage(env_dir: Path) -> list[str]:
    """What differs from the manifest ([] when nothing); a missing or unreadable manifest is damage."""
    try:
        payload = json.loads((env_dir / MANIFEST).read_text(encoding="utf-8"))
        tree = Path(payload["tree"])
        listed = {k: tuple(v) for k, v in payload["files"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return [f"{env_dir / MANIFEST} is missing or unreadable"]
    found = _walk(tree)
    problems = []
    for rel in sorted(set(listed) | set(found)):
        if rel not in found:
            problems.append(f"{tree / rel} was removed")
        elif rel not in listed:
            problems.append(f"{tree / rel} was added")
        elif found[rel] != listed[rel]:
            problems.append(f"{tree / rel} was modified")
    return problems


def describe(problems: list[str]) -> str:
    more = f" (and {len(problems) - SHOWN} more)" if len(problems) > SHOWN else ""
    return "; ".join(problems[:SHOWN]) + more
