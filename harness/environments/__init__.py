"""Cell environments: an interpreter with the cell's packages, or the reason there is none.

Providers build or find the environment of a cell (``uv.py``: one uv environment per distinct
set of requirements, built once and reused by key; ``passthrough.py``: the running interpreter
as it is). ``Environments`` is the one place a run asks for a cell's environment: it picks the
cell's provider, keeps the answer per cell for the run, and turns a failure into the reason the
cell's items are ``UNRESOLVABLE``. A new provider is one module plus its line in ``PROVIDERS``.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
from harness.environments.integrity import describe
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


class _SharedExclusive:
    """Items use an environment together (shared); a repair has it alone (exclusive)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._users = 0
        self._repairing = False

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._repairing)
            self._users += 1
        try:
            yield
        finally:
            with self._cond:
                self._users -= 1
                self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._repairing and self._users == 0)
            self._repairing = True
        try:
            yield
        finally:
            with self._cond:
                self._repairing = False
                self._cond.notify_all()


class Environments:
    """The run's environments, one answer per cell, from each cell's provider."""

    def __init__(self, cache_dir: Path, index: IndexConfig | None = None) -> None:
        self.cache_dir = Path(cache_dir)
        self._index = index
        self._uv: UvEnvironments | None = None
        self._answers: dict[str, Resolved] = {}
        self._lock = threading.Lock()
        self._use: dict[str, _SharedExclusive] = {}

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
        except (OSError, ValueError, TypeError, KeyError, subprocess.SubprocessError) as exc:
            # Whatever else goes wrong with one cell's environment (a cache it cannot write,
            # an interpreter that will not run) is that cell's trouble: the other cells still run.
            answer = Resolved(None, f"the environment could not be made ready: {type(exc).__name__}: {exc}")
        with self._lock:
            self._answers.setdefault(cell.name, answer)
            return self._answers[cell.name]

    def damage(self, env: Environment) -> list[str]:
        """What changed in ``env`` since it was built ([] when nothing did; a passthrough
        interpreter is the caller's own and is not checked)."""
        return [] if env.passthrough else self.uv.verify(env)

    @contextmanager
    def ready_for_item(self, cell: Cell) -> Iterator[Resolved]:
        """The cell's environment, checked whole before the item uses it (rebuilt first if it was
        damaged, once no other item is using it), and held while the item runs."""
        resolved = self.for_cell(cell)
        env = resolved.env
        if env is None or env.passthrough:
            yield resolved
            return
        with self._lock:
            use = self._use.setdefault(env.key, _SharedExclusive())
        problems = self.damage(env)
        if problems:
            with use.exclusive():
                problems = self.damage(env)
                if problems:
                    self.invalidate(env, f"damaged before an item of {cell.name}: {describe(problems)}")
                resolved = self.for_cell(cell)
        with use.shared():
            yield resolved

    def invalidate(self, env: Environment, reason: str) -> None:
        """``env`` was damaged: the next cell that asks for it gets it rebuilt."""
        if env.passthrough:
            return
        self.uv.invalidate(env, reason)
        with self._lock:
            for name in [n for n, a in self._answers.items() if a.env is not None and a.env.key == env.key]:
                del self._answers[name]


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
