"""The ``module`` kind: a Python module that declares ``SPEC = ReproSpec(...)`` and ``run(ctx)``.

Built-in repros are modules of the ``repros`` package; a user's can live in any directory and
are loaded from their file, with that directory importable (so a helper module beside it can be
imported). A file is a repro only if it assigns ``SPEC`` at module level: helper modules in the
same directory are left alone.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from repros.runtime.kinds.base import LoadedRepro, read_repro_file, too_large
from repros.runtime.spec import ReproSpec

USER_PACKAGE = "ft_regress_user_repros"


def declares_spec(path: Path) -> bool:
    """A module-level ``SPEC = ...`` (or ``SPEC: ... = ...``) in the file's source."""
    try:
        tree = ast.parse(read_repro_file(path), filename=str(path))
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return True  # unreadable, too large or broken: claimed, so that loading it says why
    for node in tree.body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if any(isinstance(t, ast.Name) and t.id == "SPEC" for t in targets):
            return True
    return False


def import_module_ref(ref: str) -> ModuleType:
    if not ref.endswith(".py"):
        return importlib.import_module(ref)
    path = Path(ref).resolve()
    name = f"{USER_PACKAGE}.{path.stem}"
    if name in sys.modules:
        return sys.modules[name]
    refused = too_large(path)
    if refused is not None:
        raise refused
    # The repro's own directory is importable: a helper module beside it can be imported.
    if str(path.parent) not in sys.path:
        sys.path.append(str(path.parent))
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


class ModuleKind:
    name = "module"
    suffixes: tuple[str, ...] = (".py",)

    def claims(self, path: Path) -> bool:
        return path.suffix == ".py" and not path.name.startswith("_") and declares_spec(path)

    def from_rank_params(self, ref: str, params: dict[str, Any]) -> LoadedRepro | None:
        return None

    def load(self, ref: str) -> LoadedRepro:
        module = import_module_ref(ref)
        spec = getattr(module, "SPEC", None)
        run = getattr(module, "run", None)
        if not isinstance(spec, ReproSpec) or not callable(run):
            raise TypeError("defines no SPEC (a ReproSpec) and run(ctx)")
        return LoadedRepro(spec=spec, run=run)
