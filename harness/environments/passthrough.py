"""The ``passthrough`` provider: the running interpreter as it is (a GPU runner's own stack)."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from harness.environments.base import Environment, EnvironmentUnavailable
from harness.environments.inventory import list_distributions
from harness.matrix import Cell


def passthrough_extensions_dir(cache_dir: Path, python: str) -> Path:
    digest = hashlib.sha256(str(Path(python).resolve()).encode()).hexdigest()[:12]
    return cache_dir / "torch_extensions" / f"passthrough-{digest}"


def passthrough_environment(cache_dir: Path, python: str = sys.executable) -> Environment:
    listing = list_distributions(python, isolated=False)
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
        passthrough=True,
    )


class PassthroughProvider:
    name = "passthrough"

    def __init__(self, cache_dir: Path) -> None:
        self.cache_dir = cache_dir

    def get(self, cell: Cell) -> Environment:
        return passthrough_environment(self.cache_dir)
