"""What a cell's package spec asks for: an exact pin (``==1.2.3``), reused as it is resolved the
first time, or a floating spec (a range, ``~=``, or ``*`` for the newest release) that resolves
afresh on every run to a lock, the environment keyed by that lock."""

from __future__ import annotations

from collections.abc import Mapping

from packaging.specifiers import SpecifierSet

#: The spec that asks for the newest release.
NEWEST = "*"


def is_exact(spec: str) -> bool:
    """``==X`` (or ``===X``) and nothing else, with no wildcard: a pin that names one release."""
    clauses = list(SpecifierSet(spec)) if spec and spec != NEWEST else []
    return len(clauses) == 1 and clauses[0].operator in ("==", "===") and not clauses[0].version.endswith(".*")


def floating(packages: Mapping[str, str]) -> list[str]:
    """The packages whose spec is not an exact pin, by name."""
    return sorted(name for name, spec in packages.items() if not is_exact(spec))


def requirement(name: str, spec: str) -> str:
    """The requirement line uv is given: ``name`` alone for the newest release."""
    return name if spec == NEWEST else f"{name}{spec}"
