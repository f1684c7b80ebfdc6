"""What a matrix is, once loaded: its cells (each a full set of package specs, a provider, a world
size...), its lanes, its exclusions and its grid. Nothing here depends on a cell's name."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.config.crosscheck import CrosscheckConfig
from harness.config.grid import Grid
from harness.core.errors import UserError
from harness.environments import DEFAULT_PROVIDER, provider_class
from harness.environments.specs import floating
from repros.runtime.families import DEFAULT_FAMILY

DEFAULT_WORLD_SIZE = 2
DEFAULT_PYTHON = "3.11"
DEFAULT_TIMEOUT_S = 600.0


@dataclass(frozen=True, kw_only=True)
class Cell:
    name: str
    packages: dict[str, str]
    lanes: tuple[str, ...] = ()
    world_size: int = DEFAULT_WORLD_SIZE
    python: str = DEFAULT_PYTHON
    timeout_s: float = DEFAULT_TIMEOUT_S
    exclude_newer: str | None = None
    #: The environment provider that makes its interpreter ready (``harness/environments``).
    provider: str = DEFAULT_PROVIDER
    #: The repros this cell runs (None: every repro).
    repros: tuple[str, ...] | None = None
    description: str = ""
    #: The matrix cell this one was derived from (by --pin or bisect), if any.
    origin: str | None = None
    #: The test model's size (``repros/trainer/tiny_models.py``): ``tiny`` or ``small``.
    model: str = "tiny"
    #: The test model's family (``repros/runtime/families.py``): ``qwen2`` unless the cell or ``--family``
    #: says otherwise.
    family: str = DEFAULT_FAMILY
    #: The matrix cell this one is a family variant of (``--family``): its exclusions hold here too.
    family_of: str | None = None
    #: Packages kept out of the environment even where a dependency asks for them
    #: (canonical names; uv's ``--excludes``).
    exclude_packages: tuple[str, ...] = ()
    #: Floating specs may resolve to pre-releases (``prerelease: true``).
    prerelease: bool = False
    #: Floating specs resolve to what was released before this day (``--as-of YYYY-MM-DD``); exact
    #: pins stay as written. None: as of now.
    as_of: str | None = None
    #: A resolution decided elsewhere (a bisect's day): what the environment installs, exactly.
    lock: tuple[str, ...] | None = None

    @property
    def floating(self) -> list[str]:
        """Its packages whose spec is not an exact pin: they resolve afresh for each run."""
        return floating(self.packages)

    @property
    def installs_packages(self) -> bool:
        """Whether its provider installs its ``packages`` (so ``--pin`` and ``bisect`` can change them)."""
        return provider_class(self.provider).installs_packages


@dataclass(frozen=True)
class Exclude:
    reason: str
    cell: str | None = None
    repro: str | None = None
    mode: str | None = None

    def covers(self, cell: str, repro: str, mode: str) -> bool:
        return (
            (self.cell is None or self.cell == cell)
            and (self.repro is None or self.repro == repro)
            and (self.mode is None or self.mode == mode)
        )


@dataclass(frozen=True)
class Matrix:
    path: Path
    sha256: str
    cells: dict[str, Cell]
    lanes: dict[str, str]
    default_lane: str | None
    excludes: tuple[Exclude, ...]
    #: The config grid (``harness/config/grid.py``), where the matrix declares one.
    grid: Grid | None = None
    #: Which strategies each lane's ``crosscheck`` holds against one process (``harness/config/crosscheck.py``).
    crosscheck: CrosscheckConfig = field(default_factory=CrosscheckConfig)
    #: The repros this matrix is about (``repros:``): what ``--repros`` defaults to. None: every repro.
    repros: tuple[str, ...] | None = None
    #: Directories of the user's repro files (``repros_dirs:``, relative to the matrix), absolute.
    repros_dirs: tuple[Path, ...] = ()

    def cells_in_lane(self, lane: str) -> list[Cell]:
        if lane not in self.lanes:
            known = ", ".join(sorted(self.lanes)) or "(none)"
            raise UserError(self.path, "lanes", f"no lane named {lane!r}", f"pick one of: {known}")
        return [c for c in self.cells.values() if lane in c.lanes]

    def exclusion(self, cell: str, repro: str, mode: str) -> Exclude | None:
        return next((e for e in self.excludes if e.covers(cell, repro, mode)), None)
