"""What a cell's environment is, for every provider: an interpreter with its packages listed."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


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

    def requirements(self) -> list[str]:
        return [f"{name}{spec}" for name, spec in sorted(self.packages.items())]


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
    passthrough: bool = False
    #: How DeepSpeed's ops were installed: the ops prebuilt, the pair cache, the seconds it took.
    deepspeed_ops: dict[str, object] | None = None
    #: Why this environment was built again (a damaged cached one), if it was.
    repaired: str | None = None

    def version(self, package: str) -> str | None:
        return self.packages.get(package.lower().replace("_", "-"))


class EnvironmentUnavailable(Exception):
    """The cell's environment could not be resolved, installed or used. ``reason`` says why:
    the installer's own explanation, shortened to the lines that say it."""

    def __init__(self, reason: str, log: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.log = log


def installer_reason(stderr: str) -> str:
    lines = [ln.rstrip() for ln in stderr.splitlines() if ln.strip()]
    keep = [ln for ln in lines if any(tag in ln for tag in ("×", "╰─▶", "error:", "Because", "hint:", "Caused by"))]
    return "\n".join((keep or lines)[-12:]) or "the installer failed without saying why"
