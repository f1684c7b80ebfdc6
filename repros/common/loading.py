"""Load a repro module by dotted name or by file path. Standard library only.

Built-in repros are modules of the ``repros`` package; a user's own repros can live
in any directory and are loaded from their file. Both sides of the process boundary
load them the same way.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

USER_PACKAGE = "ft_regress_user_repros"


def load_repro_module(ref: str) -> ModuleType:
    if not ref.endswith(".py"):
        return importlib.import_module(ref)
    path = Path(ref).resolve()
    name = f"{USER_PACKAGE}.{path.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load a module from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
