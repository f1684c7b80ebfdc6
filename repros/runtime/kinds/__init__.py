"""Repro kinds, registered here by name; the first that claims a file loads it.

A new kind is one module with a class that has ``name``, ``suffixes``, ``claims``, ``load`` and
``from_rank_params``, plus its line in ``KINDS``. Standard library only. A kind is registered in
code, never by an installed package: a rank reads its repro through it, inside a cell's
environment, where the orchestrator's packages are not installed.

- ``module``: a Python module with ``SPEC = ReproSpec(...)`` and ``run(ctx)`` (the built-in repros).
- ``script``: a plain training script plus a few declared lines (YAML ``repro:``, or ``REPRO = {...}``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from repros.runtime.kinds.base import LoadedRepro, ReproKind
from repros.runtime.kinds.module import ModuleKind
from repros.runtime.kinds.script import ScriptKind
from repros.runtime.registry import Registry

#: Every kind, by name, in the order they are asked whether a file is theirs.
KINDS: Registry[ReproKind] = Registry("repro kind", {kind.name: kind for kind in (ModuleKind(), ScriptKind())})
#: The kind of the built-in repros, which are modules named by their dotted name.
BUILTIN_KIND = ModuleKind.name


def suffixes() -> tuple[str, ...]:
    """The file suffixes some registered kind may claim."""
    return tuple(dict.fromkeys(s for kind in KINDS.values() for s in kind.suffixes))


def is_file_ref(ref: str) -> bool:
    """Whether ``ref`` names a repro file (a kind's suffix), not a dotted module name."""
    return ref.endswith(suffixes()) or "/" in ref


def kind_of(path: Path) -> ReproKind | None:
    """The kind that claims the file, or None: it is not a repro (a helper, a data file)."""
    return next((k for k in KINDS.values() if path.suffix in k.suffixes and k.claims(path)), None)


def load_repro(ref: str, params: dict[str, Any] | None = None) -> LoadedRepro:
    """The repro at ``ref``: a dotted module name (built-in) or a file a kind claims. On a rank,
    ``params`` may carry what its kind put in ``rank_params`` where it was described: then the
    file is not read again (a YAML declaration needs no YAML reader in a cell)."""
    for kind in KINDS.values():
        loaded = kind.from_rank_params(ref, params or {})
        if loaded is not None:
            return loaded
    if not is_file_ref(ref):
        return KINDS[BUILTIN_KIND].load(ref)  # a dotted module name
    path = Path(ref)
    claiming = kind_of(path)
    if claiming is None:
        raise ImportError(f"{ref} declares no repro of any kind ({', '.join(KINDS)})")
    return claiming.load(ref)


__all__ = ["BUILTIN_KIND", "KINDS", "LoadedRepro", "ReproKind", "is_file_ref", "kind_of", "load_repro", "suffixes"]
