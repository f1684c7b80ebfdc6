"""What a kind of repro is: how its files are recognised, and how one is loaded to run.

Standard library only. A kind ``claims`` the files of a repro directory that declare a repro of
its kind (statically: nothing of the file runs), and ``load``s one by reference into a
``LoadedRepro``: its ``SPEC`` and the ``run(ctx)`` a rank calls. Kinds are registered in
``repros/runtime/kinds/__init__.py``; the orchestrator and the ranks load repros through them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from repros.runtime.spec import ReproSpec

#: The largest repro file that is read (a repro module, a script repro's declaration): a real one
#: is a few kilobytes, and a larger one (a huge or sparse file) is refused before it is read.
MAX_REPRO_FILE_BYTES = 4 << 20


class ReproFileTooLarge(ValueError):
    """A repro file over ``MAX_REPRO_FILE_BYTES``: refused, not read."""

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self.size = size
        self.problem = f"is {size} bytes, more than a repro file may be ({MAX_REPRO_FILE_BYTES}), so it is not read"
        self.fix = "move it out of the repros directory, or declare the repro in a smaller file"
        super().__init__(f"{self.problem}; {self.fix}")


def file_size(path: Path) -> int | None:
    """The file's size as the file system says it (nothing is read), None where it cannot be told."""
    try:
        return path.stat().st_size
    except OSError:
        return None


def too_large(path: Path) -> ReproFileTooLarge | None:
    """Why the file is not read, where it is over ``MAX_REPRO_FILE_BYTES``."""
    size = file_size(path)
    return ReproFileTooLarge(path, size) if size is not None and size > MAX_REPRO_FILE_BYTES else None


def read_repro_file(path: Path) -> bytes:
    """The file's bytes, at most ``MAX_REPRO_FILE_BYTES``: a larger file raises ``ReproFileTooLarge``
    having read nothing (or no more than the cap, where it grew while being read)."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > MAX_REPRO_FILE_BYTES:
            raise ReproFileTooLarge(path, size)
        data = fh.read(MAX_REPRO_FILE_BYTES + 1)
    if len(data) > MAX_REPRO_FILE_BYTES:
        raise ReproFileTooLarge(path, len(data))
    return data


@dataclass(frozen=True)
class LoadedRepro:
    spec: ReproSpec
    run: Callable[[Any], None]
    #: The repro sets up ``torch.distributed`` itself (a user's script calls
    #: ``init_process_group``); otherwise the rank does, before ``run(ctx)``.
    owns_process_group: bool = False
    #: What the ranks need to run it besides its reference, as JSON data (a script's command):
    #: read once where the repro is described, sent with every item (``ctx.params``).
    rank_params: dict[str, Any] = field(default_factory=dict)


class ReproKind(Protocol):
    """A kind of repro file: which files it claims (read, never run), how one is loaded to run,
    and how a rank loads it from what the orchestrator sent (``rank_params``)."""

    #: Its registered name.
    name: str
    #: The file suffixes it may claim (a repro file of any other suffix is none of its).
    suffixes: tuple[str, ...]

    def claims(self, path: Path) -> bool:
        """Whether the file declares a repro of this kind (read, never run)."""
        ...

    def load(self, ref: str) -> LoadedRepro:
        """The repro at ``ref`` (a dotted module name or a file path), imported and ready to run."""
        ...

    def from_rank_params(self, ref: str, params: dict[str, Any]) -> LoadedRepro | None:
        """On a rank: the repro from what ``load`` put in ``rank_params`` (None: load ``ref`` instead)."""
        ...
