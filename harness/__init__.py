"""The orchestrator: matrix, environments, launching, outcomes, results. Never imports torch."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

__version__ = "0.1.0"


def _pin_worker_package() -> None:
    """Import ``repros`` from beside this package, whatever the current directory holds.

    A user's project may well have a ``repros/`` directory of its own; run from there, it would
    be found first on ``sys.path`` (as a namespace package) and hide the worker package that
    ships with the harness (an editable install finds packages after the path)."""
    if "repros" in sys.modules:
        return
    package = Path(__file__).resolve().parent.parent / "repros"
    init = package / "__init__.py"
    if not init.is_file():
        return  # installed some other way: the import system finds it as usual
    spec = importlib.util.spec_from_file_location("repros", init, submodule_search_locations=[str(package)])
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["repros"] = module
    spec.loader.exec_module(module)


_pin_worker_package()
