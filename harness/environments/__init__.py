"""Cell environments: an interpreter with the cell's packages, or the reason there is none.

Providers build or find the environment of a cell (``uv.py``: one uv environment per distinct
set of requirements, built once and reused by key; ``passthrough.py``: the running interpreter
as it is). ``Environments`` is the one place a run asks for a cell's environment: it picks the
cell's provider, keeps the answer per cell for the run, and turns a failure into the reason the
cell's items are ``UNRESOLVABLE``. A new provider is one module plus its line in ``PROVIDERS``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from harness.environments.base import (
    Environment,
    EnvironmentUnavailable,
    EnvRequest,
    default_cache_dir,
    installer_reason,
)
from harness.environments.passthrough import PassthroughProvider
from harness.environments.uv import UvEnvironments, UvProvider
from harness.matrix import Cell
from harness.package_index import IndexConfig, pip_index_config


class EnvironmentProvider(Protocol):
    name: str

    def get(self, cell: Cell) -> Environment:
        """The cell's environment, built if need be; ``EnvironmentUnavailable`` with the reason if not."""
        ...


@dataclass(frozen=True)
class Resolved:
    """A cell's environment, or why it has none."""

    env: Environment | None
    reason: str = ""


class Environments:
    """The run's environments, one answer per cell, from each cell's provider."""

    def __init__(self, cache_dir: Path, index: IndexConfig | None = None) -> None:
        self.cache_dir = Path(cache_dir)
        self._index = index
        self._uv: UvEnvironments | None = None
        self._answers: dict[str, Resolved] = {}
        self._lock = threading.Lock()

    @property
    def index(self) -> IndexConfig:
        if self._index is None:
            self._index = pip_index_config()
        return self._index

    @property
    def uv(self) -> UvEnvironments:
        """The uv builder (it reads pip's configuration once, on first use)."""
        if self._uv is None:
            self._uv = UvEnvironments(self.cache_dir, self.index)
        return self._uv

    def provider(self, cell: Cell) -> EnvironmentProvider:
        return PROVIDERS[cell.provider](self)

    def for_cell(self, cell: Cell) -> Resolved:
        """The cell's environment or the reason it has none; asked of its provider once per run."""
        with self._lock:
            if cell.name in self._answers:
                return self._answers[cell.name]
        try:
            answer = Resolved(self.provider(cell).get(cell))
        except EnvironmentUnavailable as exc:
            answer = Resolved(None, exc.reason)
        with self._lock:
            self._answers.setdefault(cell.name, answer)
            return self._answers[cell.name]


PROVIDERS: dict[str, Callable[[Environments], EnvironmentProvider]] = {
    "uv": lambda envs: UvProvider(envs.uv),
    "passthrough": lambda envs: PassthroughProvider(envs.cache_dir),
}

__all__ = [
    "PROVIDERS",
    "EnvRequest",
    "Environment",
    "EnvironmentProvider",
    "EnvironmentUnavailable",
    "Environments",
    "Resolved",
    "UvEnvironments",
    "default_cache_dir",
    "installer_reason",
]
