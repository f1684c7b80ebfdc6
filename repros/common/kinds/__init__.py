"""Repro kinds, registered here; the first that claims a file loads it.

A new kind is one module with a class that has ``claims``, ``load`` and ``from_rank_params``,
plus its line in ``KINDS``. Standard library only.

- ``module``: a Python module with ``SPEC = ReproSpec(...)`` and ``run(ctx)`` (the built-in repros).
- ``script``: a plain training script plus a few declared lines (YAML ``repro:``, or ``REPRO = {...}``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from repros.common.kinds.base import LoadedRepro, ReproKind
from repros.common.kinds.module import ModuleKind
from repros.common.kinds.script import ScriptKind

KINDS: tuple[ReproKind, ...] = (ModuleKind(), ScriptKind())

#: The file suffixes some kind may claim.
SUFFIXES = (".py", ".yaml", ".yml")


def kind_of(path: Path) -> ReproKind | None:
    """The kind that claims the file, or None: it is not a repro (a helper, a data file)."""
    return next((kind for kind in KINDS if kind.claims(path)), None)


def load_repro(ref: str, params: dict[str, Any] | None = None) -> LoadedRepro:
    """The repro at ``ref``: a dotted module name (built-in) or a file a kind claims. On a rank,
    ``params`` may carry what its kind put in ``rank_params`` where it was described: then the
    file is not read again (a YAML declaration needs no YAML reader in a cell)."""
    for kind in KINDS:
        loaded = kind.from_rank_params(ref, params or {})
        if loaded is not None:
            return loaded
    if not ref.endswith(SUFFIXES) and "/" not in ref:
        return KINDS[0].load(ref)  # a dotted module name
    path = Path(ref)
    claiming = kind_of(path)
    if claiming is None:
        raise ImportError(f"{ref} declares no repro of any kind ({', '.join(k.name for k in KINDS)})")
    return claiming.load(ref)


__all__ = ["KINDS", "LoadedRepro", "ReproKind", "kind_of", "load_repro"]
