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
import time
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
#: A check that found an environment whole this recently, with no item in it since, stands for the
#: check before its next item (the one after an item and the one before the next, one walk).
RECHECK_S = 5.0


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
        #: When an item last began to use it (monotonic seconds).
        self.entered = -float("inf")

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._repairing)
            self._users += 1
            self.entered = time.monotonic()
        try:
            yield
        finally:
            with self._cond:
                self._users -= 1
                self._cond.notify_all()

    @property
    def idle(self) -> bool:
        """No item uses it and no repair is under way."""
        with self._cond:
            return self._users == 0 and not self._repairing

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
        #: When each environment was last found whole (monotonic seconds).
        self._clean: dict[str, float] = {}

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

    def cached(self, cell: CellRequest) -> bool:
        """Whether the cell's environment is ready to be had without a build (a cheap look)."""
        with self._lock:
            if cell.name in self._answers:
                return True
        look = getattr(self.provider(cell.provider), "cached", None)  # optional (``EnvironmentProvider``)
        try:
            return bool(look(cell)) if look is not None else False
        except (EnvironmentUnavailable, OSError, ValueError, TypeError, KeyError, subprocess.SubprocessError):
            return False

    def cancel_builds(self) -> None:
        """An interrupt: every provider stops the builds under way on other threads."""
        with self._lock:
            providers = list(self._providers.values())
        for provider in providers:
            cancel = getattr(provider, "cancel", None)  # optional (``EnvironmentProvider``)
            if cancel is not None:
                cancel()

    def damage(self, env: Environment) -> list[str]:
        """What changed in ``env`` since it was made ready ([] when nothing did)."""
        problems = self.provider(env.provider).damage(env)
        with self._lock:
            if problems:
                self._clean.pop(self._use_key(env), None)
            else:
                self._clean[self._use_key(env)] = time.monotonic()
        return problems

    @staticmethod
    def _use_key(env: Environment) -> str:
        return f"{env.provider}:{env.key}"

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
            use = self._use.setdefault(self._use_key(env), _SharedExclusive())
            # The check after the previous item (one made while it held the environment), a moment ago,
            # with no item in it since, stands for this one: a change another process made in between
            # is then named after this item (INFRA, what changed), not before it.
            clean = self._clean.get(self._use_key(env))
            just_checked = (
                clean is not None and use.idle and clean > use.entered and time.monotonic() - clean < RECHECK_S
            )
        problems = [] if just_checked else self.damage(env)
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
