"""Which expectation a repro declares for a cell's resolved versions.

Consulted only after an outcome has been observed, to say whether it matched.
"""

from __future__ import annotations

from collections.abc import Mapping

from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from repros.runtime.spec import Expectation, ReproSpec


def holds(when: Mapping[str, str], versions: Mapping[str, str | None]) -> bool:
    for package, spec in when.items():
        installed = versions.get(canonicalize_name(package))
        if installed is None:
            return False
        try:
            if not SpecifierSet(spec, prereleases=True).contains(Version(installed)):
                return False
        except InvalidVersion:
            return False
    return True


def expectation_for(
    spec: ReproSpec,
    mode: str,
    versions: Mapping[str, str | None],
    device: str | None = None,
    world_size: int | None = None,
) -> Expectation | None:
    """The first expectation of ``mode`` whose version ranges all hold, whose device, if it names
    one, is the device the ranks ran on, and whose world sizes, if bounded, hold the item's."""
    return next(
        (
            e
            for e in spec.expectations
            if e.mode == mode
            and (e.device is None or e.device == device)
            and (e.world_sizes.unbounded or world_size in e.world_sizes)
            and holds(e.when, versions)
        ),
        None,
    )
