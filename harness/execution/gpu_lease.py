"""Lend GPUs to items that run side by side (pytest-xdist workers, or any processes
on one machine): each item gets its own set, sized to its world size, and no GPU is
ever lent twice at once.

The pool is what ``CUDA_VISIBLE_DEVICES`` names, or else every GPU ``nvidia-smi``
lists (no torch needed). Each GPU has a lock file in one directory per machine; an
item takes its GPUs all at once (an exclusive ``flock`` on each, non-blocking),
or, when too few are free, lets go of any it took and tries again shortly, so two
items can never hold part of what the other waits for. The kernel drops a dead
process's locks, so a killed worker never leaves a GPU lent.
"""

from __future__ import annotations

import fcntl
import os
import random
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO

LOCK_DIR_ENV = "FT_REGRESS_GPU_LOCK_DIR"
VISIBLE = "CUDA_VISIBLE_DEVICES"


def visible_gpus(environ: dict[str, str] | None = None) -> list[str]:
    """The GPUs items may use: ``CUDA_VISIBLE_DEVICES``'s entries when it is set, else nvidia-smi's."""
    environ = dict(os.environ if environ is None else environ)
    if VISIBLE in environ:
        entries = [e.strip() for e in environ[VISIBLE].split(",") if e.strip()]
        # CUDA stops at the first invalid entry ("-1" hides every GPU).
        valid = []
        for entry in entries:
            if entry.startswith("-"):
                break
            valid.append(entry)
        return valid
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        out = subprocess.run(
            [smi, "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip().isdigit()]


def lock_dir() -> Path:
    return Path(os.environ.get(LOCK_DIR_ENV) or Path(tempfile.gettempdir()) / "ft-regress-gpu-locks")


def _lock_name(gpu: str) -> str:
    return "gpu-" + re.sub(r"[^A-Za-z0-9._-]", "_", gpu) + ".lock"


def _try_take(directory: Path, gpus: Sequence[str], count: int) -> tuple[list[str], list[IO[str]]]:
    taken: list[str] = []
    handles: list[IO[str]] = []
    for gpu in gpus:
        handle: IO[str] = open(directory / _lock_name(gpu), "a")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        taken.append(gpu)
        handles.append(handle)
        if len(taken) == count:
            return taken, handles
    for handle in handles:
        _release(handle)
    return [], []


def _release(handle: IO[str]) -> None:
    fcntl.flock(handle, fcntl.LOCK_UN)
    handle.close()


@contextmanager
def lease(count: int, pool: Sequence[str], directory: Path | None = None, poll_s: float = 0.5) -> Iterator[list[str]]:
    """Hold ``count`` GPUs of ``pool`` for the ``with`` block; wait until that many are free.

    ``count`` must not exceed ``len(pool)`` (such an item is skipped before it gets here).
    """
    if count <= 0:
        yield []
        return
    if count > len(pool):
        raise ValueError(f"{count} GPUs wanted, the pool has {len(pool)}")
    directory = directory or lock_dir()
    directory.mkdir(parents=True, exist_ok=True)
    while True:
        taken, handles = _try_take(directory, pool, count)
        if taken:
            break
        time.sleep(poll_s * (0.5 + random.random()))
    try:
        yield taken
    finally:
        for handle in handles:
            _release(handle)
