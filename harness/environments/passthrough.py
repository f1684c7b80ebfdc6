"""The ``passthrough`` provider: the running interpreter as it is (a GPU runner's own stack)."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import ClassVar

from harness.environments.base import CellRequest, Environment, EnvironmentUnavailable, ProviderContext
from harness.environments.stacks import read_interpreter


def passthrough_extensions_dir(cache_dir: Path, python: str) -> Path:
    digest = hashlib.sha256(str(Path(python).resolve()).encode()).hexdigest()[:12]
    return cache_dir / "torch_extensions" / f"passthrough-{digest}"


def passthrough_environment(cache_dir: Path, python: str = sys.executable) -> Environment:
    listing = read_interpreter(python)
    if "torch" not in listing.packages:
        raise EnvironmentUnavailable(f"passthrough: the running interpreter {python} has no torch installed")
    extensions = os.environ.get("TORCH_EXTENSIONS_DIR") or str(passthrough_extensions_dir(cache_dir, python))
    return Environment(
        key="passthrough",
        python=python,
        python_version=listing.python_version,
        packages=listing.packages,
        path=None,
        extensions_dir=extensions,
        reused=True,
        build_s=0.0,
        provider=PassthroughProvider.name,
    )


class PassthroughProvider:
    """The caller's interpreter, as it is: nothing is installed, built or checked (it is the
    caller's), and a rank keeps the caller's ``PYTHONPATH``."""

    name: ClassVar[str] = "passthrough"
    installs_packages: ClassVar[bool] = False

    def __init__(self, context: ProviderContext) -> None:
        self.cache_dir = context.cache_dir

    def get(self, cell: CellRequest) -> Environment:
        return passthrough_environment(self.cache_dir)

    def damage(self, env: Environment) -> list[str]:
        return []

    def invalidate(self, env: Environment, reason: str) -> None:
        pass

    def release(self, env: Environment) -> None:
        pass

    def cached(self, cell: CellRequest) -> bool:
        return True

    def readiness(self, env: Environment) -> str:
        return "the running interpreter, as it is"

    @classmethod
    def rank_import_path(cls, env: Environment) -> list[str]:
        caller = os.environ.get("PYTHONPATH")
        return [caller] if caller else []
