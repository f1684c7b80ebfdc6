"""What a kind of repro is: how its files are recognised, and how one is loaded to run.

Standard library only. A kind ``claims`` the files of a repro directory that declare a repro of
its kind (statically: nothing of the file runs), and ``load``s one by reference into a
``LoadedRepro``: its ``SPEC`` and the ``run(ctx)`` a rank calls. Kinds are registered in
``repros/common/kinds/__init__.py``; the orchestrator and the ranks load repros through them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from repros.common.spec import ReproSpec


@dataclass(frozen=True)
class LoadedRepro:
    spec: ReproSpec
    run: Callable[[Any], None]


class ReproKind(Protocol):
    name: str

    def claims(self, path: Path) -> bool:
        """Whether the file declares a repro of this kind (read, never run)."""
        ...

    def load(self, ref: str) -> LoadedRepro:
        """The repro at ``ref`` (a dotted module name or a file path), imported and ready to run."""
        ...
