"""Cell environments: an interpreter with the cell's packages, or the reason there is none.

Providers build or find the environment of a cell (``uv.py``: one uv environment per distinct
set of requirements, built once and reused by key; ``passthrough.py``: the running interpreter
as it is). The matrix names a cell's provider (``provider:``, default ``uv``). ``Environments``
is the one place a run asks for a cell's environment: it asks the cell's provider, keeps the
answer per cell for the run, turns a failure into the reason the cell's items are
``UNRESOLVABLE``, and asks the provider, never which one it is, whether an environment was
damaged. A new provider is one module plus its line in ``PROVIDERS``, or an installed package's entry
point in the ``ft_regress.providers`` group (``repros/runtime/registry.py``).
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from harness.environments.base import (
    CellRequest,
    Environment,
    EnvironmentProvider,
    EnvironmentUnavailable,
    EnvRequest,
    ProviderContext,
    default_cache_dir,
    installer_reason,
)
from harness.environments.index import IndexConfig, pip_index_config
from harness.environments.integrity import describe
from harness.environments.passthrough import PassthroughProvider
from harness.environments.uv import UvEnvironments, UvProvider
from repros.runtime.registry import Registry

#: The providers a matrix can name, by name.
PROVIDERS: Registry[Callable[[ProviderContext], EnvironmentProvider]] = Registry(
    "environment provider",
    {UvProvider.name: UvProvider, PassthroughProvider.name: PassthroughProvider},
    group="ft_regress.providers",
)
DEFAULT_PROVIDER = UvProvider.name


def provider_class(name: str) -> type[EnvironmentProvider]:
    """The registered provider ``name`` (its class-level facts: ``installs_packages``...)."""
    factory = PROVIDERS[name]
    if not isinstance(factory, type):
        raise TypeError(f"provider {name!r} is registered as a factory, not a class")
    return factory


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

    def __init__(
        self,
        cache_dir: Path,
        index: IndexConfig | None = None,
        providers: Mapping[str, EnvironmentProvider] | None = None,
        cache_max_gb: float | None = None,
    ) -> None:
        self.cache_dir = Path(cache_dir)
        self.cache_max_gb = cache_max_gb
        self._index = index
        #: The providers made so far, by name (one each per run; ``providers`` given ones, a test's).
        self._providers: dict[str, EnvironmentProvider] = dict(providers or {})
        self._answers: dict[str, Resolved] = {}
        self._lock = threading.Lock()
        self._use: dict[str, _SharedExclusive] = {}

    @property
    def index(self) -> IndexConfig:
        if self._index is None:
            self._index = pip_index_config()
        return self._index

    def provider(self, name: str) -> EnvironmentProvider:
        """The run's provider ``name``, made on first use."""
        with self._lock:
            if name not in self._providers:
                context = ProviderContext(self.cache_dir, lambda: self.index, self.cache_max_gb)
                self._providers[name] = PROVIDERS[name](context)
            return self._providers[name]

    @property
    def uv(self) -> UvEnvironments:
        """The uv builder (resolving without installing: bisect by date, a floating cell)."""
        provider = self.provider(UvProvider.name)
        if not isinstance(provider, UvProvider):
            raise TypeError(f"the provider registered as {UvProvider.name!r} is not uv's")
        return provider.builder

    def for_cell(self, cell: CellRequest) -> Resolved:
        """The cell's environment or the reason it has none; asked of its provider once per run."""
        with self._lock:
            if cell.name in self._answers:
                return self._answers[cell.name]
        try:
            answer = Resolved(self.provider(cell.provider).get(cell))
        except EnvironmentUnavailable as exc:
            answer = Resolved(None, exc.reason)
        except (OSError, ValueError, TypeError, KeyError, subprocess.SubprocessError) as exc:
            # Whatever else goes wrong with one cell's environment (a cache it cannot write,
            # an interpreter that will not run) is that cell's trouble: the other cells still run.
            answer = Resolved(None, f"the environment could not be made ready: {type(exc).__name__}: {exc}")
        with self._lock:
            self._answers.setdefault(cell.name, answer)
            return self._answers[cell.name]

    def lock_for_nodes(self, cell: CellRequest) -> tuple[str, ...] | None:
        """The cell's floating specs resolved to exact pins now, for a run whose nodes build the
        environments (every node then builds the same lock); None where the cell needs no resolving,
        or cannot be resolved here (its nodes then say why)."""
        provider = self.provider(cell.provider)
        if not isinstance(provider, UvProvider) or cell.lock is not None:
            return None
        try:
            return provider.lock_lines(cell)
        except (EnvironmentUnavailable, OSError, ValueError, subprocess.SubprocessError):
            return None

    def release(self, env: Environment) -> None:
        """The run no longer needs ``env`` (a bisect's step is over): another run may evict it."""
        self.provider(env.provider).release(env)

    def damage(self, env: Environment) -> list[str]:
        """What changed in ``env`` since it was made ready ([] when nothing did)."""
        return self.provider(env.provider).damage(env)

    def readiness(self, env: Environment) -> str:
        return self.provider(env.provider).readiness(env)

    @contextmanager
    def ready_for_item(self, cell: CellRequest) -> Iterator[Resolved]:
        """The cell's environment, checked whole before the item uses it (made again first if it
        was damaged, once no other item is using it), and held while the item runs."""
        resolved = self.for_cell(cell)
        env = resolved.env
        if env is None:
            yield resolved
            return
        with self._lock:
            use = self._use.setdefault(f"{env.provider}:{env.key}", _SharedExclusive())
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
        """``env`` was damaged: the next cell that asks for it gets it made again."""
        self.provider(env.provider).invalidate(env, reason)
        with self._lock:
            for name in [n for n, a in self._answers.items() if a.env is not None and a.env.key == env.key]:
                del self._answers[name]


__all__ = [
    "DEFAULT_PROVIDER",
    "PROVIDERS",
    "CellRequest",
    "EnvRequest",
    "Environment",
    "EnvironmentProvider",
    "EnvironmentUnavailable",
    "Environments",
    "ProviderContext",
    "Resolved",
    "UvEnvironments",
    "default_cache_dir",
    "installer_reason",
    "provider_class",
]
