"""Repro kinds, registered here; the first that claims a file loads it.

A new kind (a plain training script with a few declared lines, say) is one module with a class
that has ``claims`` and ``load``, plus its line in ``KINDS``. Standard library only.
"""

from __future__ import annotations

from pathlib import Path

from repros.common.kinds.base import LoadedRepro, ReproKind
from repros.common.kinds.module import ModuleKind

KINDS: tuple[ReproKind, ...] = (ModuleKind(),)


def kind_of(path: Path) -> ReproKind | None:
    """The kind that claims the file, or None: it is not a repro (a helper, a data file)."""
    return next((kind for kind in KINDS if kind.claims(path)), None)


def load_repro(ref: str) -> LoadedRepro:
    """The repro at ``ref``: a dotted module name (built-in) or a file a kind claims."""
    if not ref.endswith(tuple(_suffixes())) and "/" not in ref:
        return KINDS[0].load(ref)  # a dotted module name
    path = Path(ref)
    kind = kind_of(path)
    if kind is None:
        raise ImportError(f"{ref} declares no repro of any kind ({', '.join(k.name for k in KINDS)})")
    return kind.load(ref)


def _suffixes() -> list[str]:
    return [".py", ".yaml", ".yml", ".toml"]


__all__ = ["KINDS", "LoadedRepro", "ReproKind", "kind_of", "load_repro"]
