"""What a cell's environment is, for every provider: an interpreter with its packages listed."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

from harness.environments.index import IndexConfig
from harness.environments.specs import floating, requirement


def default_cache_dir() -> Path:
    """``$FT_REGRESS_CACHE``, else ``$XDG_CACHE_HOME/ft-regress``, else ``~/.cache/ft-regress``."""
    explicit = os.environ.get("FT_REGRESS_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ft-regress"


@dataclass(frozen=True)
class EnvRequest:
    packages: dict[str, str]
    python: str
    exclude_newer: str | None
    #: Packages never installed, even as a dependency (uv's ``--excludes``); canonical names.
    exclude_packages: tuple[str, ...] = ()
    #: Floating specs resolve as of this day (exact pins stay as written); None: now.
    as_of: str | None = None
    #: Floating specs may resolve to pre-releases.
    prerelease: bool = False
    #: What the floating specs resolved to (``name==version`` lines, sorted): what the environment
    #: installs and is keyed by. None for a request of exact pins only.
    lock: tuple[str, ...] | None = None

    def requirements(self) -> list[str]:
        return [requirement(name, spec) for name, spec in sorted(self.packages.items())]

    @property
    def floating(self) -> list[str]:
        return floating(self.packages)

    def locked_versions(self) -> dict[str, str]:
        """The lock as package -> version."""
        return dict(line.split("==", 1) for line in self.lock or ())


@dataclass(frozen=True)
class Environment:
    key: str
    python: str
    python_version: str
    #: Every installed distribution and its version (normalised lower-case names).
    packages: dict[str, str]
    path: str | None
    extensions_dir: str
    reused: bool
    build_s: float
    #: The provider that made it ready (``PROVIDERS`` in ``harness/environments/__init__.py``).
    provider: str = "uv"
    #: How DeepSpeed's ops were installed: the ops prebuilt, the pair cache, the seconds it took.
    deepspeed_ops: dict[str, object] | None = None
    #: Why this environment was built again (a damaged cached one), if it was.
    repaired: str | None = None
    #: The lock its floating specs resolved to (``name==version`` lines), where it has any.
    lock: tuple[str, ...] | None = None
    #: How the lock was resolved: the day it was resolved as of, the seconds it took, what was
    #: exempted from the cut-off (a package a pin needs newer than the day).
    resolution: dict[str, object] | None = None
    #: A build's seconds by step (``install``: uv, DeepSpeed and its op; ``share``: files linked to
    #: the store; ``manifest``; ``bytecode``: placed from the store); ``build_s`` is their sum.
    build_steps: dict[str, float] | None = None
    #: The CPU seconds its installer's processes used (downloads, installs, DeepSpeed's setup).
    build_cpu_s: float | None = None
    #: Its interpreter's bytecode, as the store names it (``cpython-311-a70d0d0a``); None where none is
    #: kept for it (``bytecode.py``).
    interpreter: str | None = None
    #: Where its worker and ranks keep what their imports compile (``$FT_REGRESS_BYTECODE_STORE``).
    bytecode_store: str | None = None

    def version(self, package: str) -> str | None:
        return self.packages.get(package.lower().replace("_", "-"))


class EnvironmentUnavailable(Exception):
    """The cell's environment could not be resolved, installed or used. ``reason`` says why:
    the installer's own explanation, shortened to the lines that say it."""

    def __init__(self, reason: str, log: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.log = log


def installer_reason(stderr: str, returncode: int = 1) -> str:
    """Why the installer failed, in its own words; one a signal stopped says which (it failed for no
    reason of its own: something stopped it, as a job's cancellation or a Ctrl-C does)."""
    lines = [ln.rstrip() for ln in stderr.splitlines() if ln.strip()]
    keep = [ln for ln in lines if any(tag in ln for tag in ("×", "╰─▶", "error:", "Because", "hint:", "Caused by"))]
    said = "\n".join((keep or lines)[-12:])
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"the installer was stopped by {name}" + (f": {said}" if said else "")
    return said or "the installer failed without saying why"


@dataclass(frozen=True)
class ProviderContext:
    """What a provider may need from the run: the environment cache, and where packages come from
    (read on first use: it asks pip)."""

    cache_dir: Path
    index: Callable[[], IndexConfig]
    #: The environment cache's budget (``--cache-max-gb``); None: the default (``cache.py``).
    cache_max_gb: float | None = None


class CellRequest(Protocol):
    """What a provider needs of a matrix cell (``harness.config.matrix.Cell`` is one)."""

    @property
    def name(self) -> str: ...
    @property
    def provider(self) -> str: ...
    @property
    def packages(self) -> Mapping[str, str]: ...
    @property
    def python(self) -> str: ...
    @property
    def exclude_newer(self) -> str | None: ...
    @property
    def exclude_packages(self) -> tuple[str, ...]: ...
    @property
    def as_of(self) -> str | None: ...
    @property
    def prerelease(self) -> bool: ...
    @property
    def lock(self) -> tuple[str, ...] | None: ...


class EnvironmentProvider(Protocol):
    """Builds or finds a cell's environment. A new provider is one module with a class like this,
    plus its line in ``PROVIDERS``; the matrix names it (``provider:``) and the rest of the harness
    asks it, never which one it is.

    Two members are optional (``Environments`` asks for them where they exist): ``cached(cell) ->
    bool``, whether ``get`` would find the cell's environment ready without building it (a cheap look:
    the ready ones are made ready first; without it, none is taken to be), and ``cancel()``, an
    interrupt: stop the builds ``get`` is making on other threads and start none."""

    #: Its registered name, as the matrix names it.
    name: ClassVar[str]
    #: Whether it installs what the cell's ``packages`` say, so that ``--pin`` and ``bisect`` can
    #: change them (a provider that takes an interpreter as it is cannot).
    installs_packages: ClassVar[bool]

    def get(self, cell: CellRequest) -> Environment:
        """The cell's environment, built if need be; ``EnvironmentUnavailable`` with the reason if not."""
        ...

    def damage(self, env: Environment) -> list[str]:
        """What changed in ``env`` since it was made ready ([] when nothing did, or it is not checked)."""
        ...

    def invalidate(self, env: Environment, reason: str) -> None:
        """``env`` was damaged: the next cell that asks for it gets it made again."""
        ...

    def readiness(self, env: Environment) -> str:
        """How ``env`` was made ready, in a few words (``reused``, ``built in 12.0s``)."""
        ...

    def release(self, env: Environment) -> None:
        """The run no longer needs ``env``: a cache may evict it (nothing, for a provider without one)."""
        ...

    @classmethod
    def rank_import_path(cls, env: Environment) -> list[str]:
        """What a rank's ``PYTHONPATH`` keeps besides the worker package (the caller's own
        path, for an interpreter set up by the caller)."""
        ...
