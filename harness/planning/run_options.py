"""A run's options as values, one per concern. Each is parsed once (``harness/cli/options.py``, for
the command line and the pytest plugin alike), stored into ``run.json`` and restored from it by its
own class (``stored`` / ``restored``), and written back as flags by its own class where a command
reruns part of a run (``flags``):

- ``Selection``: which items (the lane, cells, repros, modes, the user's repro directories, a shard);
- ``StackChoice``: what chose each selected cell's stack over the matrix's own (``--pin``,
  ``--as-of``, ``--model``, ``--world-size``, ``--family``). Every rerun command carries it, so a
  rerun runs the stack the item ran on;
- ``ExecutorChoice``: where and how items run (``--executor`` and the options the executor declares,
  ``--launcher``, ``--jobs``);
- ``AttemptPolicy``: how many times an item runs (``--repeat``, ``--reruns``);
- ``CacheChoice``: the environment cache and its budget.

``RunOptions`` holds them beside the loaded matrix and repros. ``run.json`` keeps every concern's
fields side by side under ``options`` (one flat object, as it always has), each class taking its
own back. nox's ``_options.py`` keeps its options the same way: defined once, parsed once, read
as values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_serializer, field_validator

from harness.config.locate import find_matrix
from harness.config.matrix import Matrix, declared_repros_dirs, load_matrix, read_matrix_file
from harness.config.model import Cell
from harness.config.repros import Discovery, discover
from harness.core.errors import UserError
from harness.core.json import JsonObject, JsonValue
from harness.core.paths import check_path
from harness.planning.shards import Shard, parse_shard
from repros.runtime.families import FAMILIES
from repros.runtime.spec import MODES


class _Choice(BaseModel):
    """One concern's options: frozen, stored as its own fields of ``run.json``'s ``options``."""

    #: A field nobody declared is refused, never dropped.
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    def stored(self) -> JsonObject:
        """Its fields as ``run.json`` keeps them (JSON values, by their stored names)."""
        return self.model_dump(mode="json", by_alias=True)

    def evolve(self, **changes: object) -> Self:
        """A new value: this one with ``changes`` (by field name), validated like any other."""
        return type(self).model_validate({**dict(self), **changes})

    @classmethod
    def restored(cls, stored: Mapping[str, object], where: str | Path = "run.json") -> Self:
        """Its value from ``run.json``'s ``options`` (the other concerns' fields are left to them);
        a ``UserError`` naming the field where one is not what it should be."""
        own = {key for name, info in cls.model_fields.items() for key in (name, info.alias) if key}
        try:
            return cls.model_validate({k: v for k, v in stored.items() if k in own})
        except ValidationError as exc:
            error = exc.errors()[0]
            field = ".".join(str(p) for p in ("options", *error["loc"]))
            raise UserError(where, field, error["msg"], "start a new run instead of resuming this one") from None


def check_families(flag: str, families: Sequence[str]) -> tuple[str, ...]:
    """The model families named, each known (``repros/runtime/families.py``); the one place an unknown
    family is refused, whichever flag named it (``--family``, ``grid --only family=``)."""
    for family in families:
        if family not in FAMILIES:
            raise UserError(flag, family, "unknown model family", f"use one of: {', '.join(FAMILIES)}")
    return tuple(families)


class Selection(_Choice):
    """Which items a run plans: cell x repro x mode."""

    lane: str | None = None
    cells: tuple[str, ...] = ()
    repros: tuple[str, ...] = ()
    modes: tuple[str, ...] = MODES
    #: The user's repro directories (``--repros-dir``), absolute.
    repros_dirs: tuple[Path, ...] = ()
    #: Only this shard of the plan (``--shard I/N``), balanced by the reports directory's history.
    shard: Shard | None = None

    @field_validator("shard", mode="before")
    @classmethod
    def _shard(cls, value: object) -> object:
        return parse_shard(value) if isinstance(value, str) else value

    @field_serializer("shard")
    def _shard_text(self, shard: Shard | None) -> str | None:
        return str(shard) if shard is not None else None

    def flags(self) -> list[str]:
        """The selection as the flags that choose it again."""
        args: list[str] = []
        if self.lane and not self.cells:
            args += ["--lane", self.lane]
        for flag, values in (("--cells", self.cells), ("--repros", self.repros), ("--modes", self.modes)):
            if values:
                args += [flag, ",".join(values)]
        for directory in self.repros_dirs:
            args += ["--repros-dir", str(directory)]
        if self.shard is not None:
            args += ["--shard", str(self.shard)]
        return args


def pinned_cell(cell: Cell, pins: Sequence[tuple[str, str]]) -> Cell:
    """``cell`` with some packages pinned over its own specs; named after its origin."""
    suffix = "+".join(f"{name}-{spec.lstrip('=<>!~')}" for name, spec in pins)
    return dataclasses.replace(
        cell,
        name=f"{cell.name}+{suffix}",
        packages={**cell.packages, **dict(pins)},
        origin=cell.origin or cell.name,
    )


def family_cell(cell: Cell, family: str) -> Cell:
    """``cell`` training ``family``'s model: itself where that is its own family, else a variant named
    ``<cell>@<family>`` that keeps the cell's exclusions."""
    if family == cell.family:
        return cell
    return dataclasses.replace(cell, name=f"{cell.name}@{family}", family=family, family_of=cell.family_of or cell.name)


class StackChoice(_Choice):
    """What chose the selected cells' stacks over the matrix's own: packages pinned, the day floating
    specs resolve as of, the model's size and family, the ranks an item launches. A rerun command
    carries all of it (``flags``), so it runs the stack the item ran on."""

    #: Packages pinned over every selected cell's own spec (``--pin deepspeed==0.19.5``): name, specifier.
    pins: tuple[tuple[str, str], ...] = ()
    #: Floating specs resolve to what was released before this day (``--as-of YYYY-MM-DD``).
    as_of: str | None = None
    #: The test model's size for every selected cell (``--model``), over the cells' own.
    model: str | None = None
    #: The ranks every selected cell's items launch with (``--world-size``), over the cells' own.
    world_size: int | None = Field(default=None, ge=1)
    #: The model families every selected cell runs in (``--family``); (): each cell's own.
    families: tuple[str, ...] = ()

    @field_validator("families")
    @classmethod
    def _known(cls, families: tuple[str, ...]) -> tuple[str, ...]:
        return check_families("--family", families)

    @property
    def pins_text(self) -> str:
        return " ".join(f"{name}{spec}" for name, spec in self.pins)

    def cells(self, cells: Sequence[Cell]) -> list[Cell]:
        """The selected cells as this stack choice makes them (cells whose provider installs no
        packages are left out where something is pinned: see ``planning.items.unpinnable_cells``)."""
        chosen = list(cells)
        if self.pins:
            chosen = [pinned_cell(c, self.pins) for c in chosen if c.installs_packages]
        if self.model:
            chosen = [dataclasses.replace(c, model=self.model) for c in chosen]
        if self.world_size:
            chosen = [dataclasses.replace(c, world_size=self.world_size) for c in chosen]
        if self.families:
            chosen = [family_cell(c, family) for c in chosen for family in self.families]
        if self.as_of:
            chosen = [dataclasses.replace(c, as_of=self.as_of) for c in chosen]
        return chosen

    def for_cell(self, cell: Cell) -> StackChoice:
        """This choice as it made one cell: the cell's own family where it runs in another than the
        matrix cell's (one item's rerun runs that family only)."""
        return self.model_copy(update={"families": (cell.family,) if cell.family_of is not None else ()})

    def flags(self) -> list[str]:
        """The command-line flags that make this choice again."""
        args: list[str] = []
        for name, spec in self.pins:
            args += ["--pin", f"{name}{spec}"]
        if self.as_of:
            args += ["--as-of", self.as_of]
        if self.model:
            args += ["--model", self.model]
        if self.world_size:
            args += ["--world-size", str(self.world_size)]
        if self.families:
            args += ["--family", ",".join(self.families)]
        return args


class ExecutorChoice(_Choice):
    """Where an item's attempts run and what starts its ranks."""

    #: A registered executor's name (``harness/pipeline/executors``): "local", "ray", "slurm"...
    name: str = Field(default="local", alias="executor")
    #: The options the executor declares (its class's ``options``: Ray's ``--ray-address``, Slurm's
    #: ``--slurm-folder`` and ``--slurm-param``...), by destination, as they were given; the executor reads
    #: and checks its own.
    executor_options: dict[str, JsonValue] = Field(default_factory=dict)
    #: A registered launcher's name (``harness/execution/launchers``): "worker" or "torchrun".
    launcher: str = "worker"
    #: Items run at once, at most; 0: as many as the machine's cores, memory and GPUs fit (local).
    jobs: int = Field(default=1, ge=0)

    @classmethod
    def restored(cls, stored: Mapping[str, object], where: str | Path = "run.json") -> Self:
        """As ``_Choice.restored``; a ``run.json`` written before executors declared their options kept
        Ray's and Slurm's as fields of their own (``ray_address``, ``slurm_folder``, ``slurm_parameters``
        as name/value pairs): they are read as the options ``--ray-address``, ``--slurm-folder`` and
        ``--slurm-param`` give now, so resuming such a run keeps where it ran."""
        legacy: dict[str, JsonValue] = {}
        if stored.get("ray_address"):
            legacy["ray_address"] = str(stored["ray_address"])
        if stored.get("slurm_folder"):
            legacy["slurm_folder"] = str(stored["slurm_folder"])
        pairs = stored.get("slurm_parameters")
        if isinstance(pairs, list) and pairs:
            legacy["slurm_param"] = [
                f"{pair[0]}={pair[1]}" if isinstance(pair, list) and len(pair) == 2 else str(pair) for pair in pairs
            ]
        if legacy:
            given = stored.get("executor_options")
            stored = {**stored, "executor_options": {**legacy, **(given if isinstance(given, dict) else {})}}
        return super().restored(stored, where)


class AttemptPolicy(_Choice):
    """How many times an item runs."""

    #: Every item this many times (``--repeat``), each attempt recorded; attempts that disagree make
    #: the item FLAKY, with the count of each outcome.
    repeat: int = Field(default=1, ge=1)
    #: An item again, up to this many times, while its outcome contradicts its expectation
    #: (``--reruns``): a race upstream is told from a regression, every attempt kept.
    reruns: int = Field(default=0, ge=0)

    def model_post_init(self, context: object) -> None:
        if self.reruns and self.repeat > 1:
            raise UserError(
                "--repeat",
                str(self.repeat),
                "cannot be combined with --reruns",
                "--repeat runs every item N times; --reruns runs again only what contradicts its expectation: give one",
            )


class CacheChoice(_Choice):
    """The environment cache: the directory the user named (``--cache-dir``; else ``$FT_REGRESS_CACHE``
    or the default, found again where the run is resumed) and its budget."""

    #: The directory given with ``--cache-dir``, or None.
    cache_dir: Path | None = None
    #: The budget in GB (``--cache-max-gb``); None: ``environments/cache.py``'s default.
    cache_max_gb: float | None = None
    #: The directory in use, resolved (the one given, else the default). Not stored.
    resolved: Path = Path()

    @property
    def given(self) -> bool:
        return self.cache_dir is not None

    @property
    def path(self) -> Path:
        return self.resolved

    def stored(self) -> JsonObject:
        return {"cache_dir": str(self.cache_dir) if self.cache_dir else None, "cache_max_gb": self.cache_max_gb}

    def flags(self) -> list[str]:
        return ["--cache-dir", str(self.cache_dir)] if self.cache_dir is not None else []


@dataclass(frozen=True)
class RunOptions:
    """Everything a run was asked: the matrix and the repros it can name (loaded), and one value per
    concern. Built once per command (``harness.cli.options.selection``), or restored from a run's
    ``run.json`` (``restored``)."""

    matrix: Matrix
    discovery: Discovery
    selection: Selection = Selection()
    stack: StackChoice = StackChoice()
    executor: ExecutorChoice = ExecutorChoice()
    attempts: AttemptPolicy = AttemptPolicy()
    cache: CacheChoice = CacheChoice()
    out_dir: Path | None = None
    #: Where run directories go (the shard balance reads its history there too).
    reports_dir: Path = Path("reports")
    #: The shard's items as first planned (``--resume`` keeps them, whatever the history says now).
    shard_items: tuple[str, ...] | None = None
    #: Explore (``--explore``): every item's observation is a finding, not checked against an
    #: expectation. A repro that declares no expectation for a mode is explored in it anyway.
    explore: bool = False
    #: After the run, write what was observed back as the repros' expectations (``--save-expectations``).
    save_expectations: bool = False

    @property
    def cache_dir(self) -> Path:
        """The environment cache in use."""
        return self.cache.path

    def stored(self) -> JsonObject:
        """``run.json``'s ``options``: what ``run --resume`` needs to plan and run the same items the
        same way (every concern's fields side by side)."""
        return {
            "matrix": str(self.matrix.path),
            **self.selection.stored(),
            **self.stack.stored(),
            **self.executor.stored(),
            **self.attempts.stored(),
            **self.cache.stored(),
            "reports_dir": str(self.reports_dir),
            "explore": self.explore,
        }

    @classmethod
    def restored(
        cls,
        stored: Mapping[str, object],
        where: Path,
        *,
        cache_dir: Path,
        out_dir: Path | None = None,
        shard_items: tuple[str, ...] | None = None,
    ) -> RunOptions:
        """The options ``stored`` holds (a run's ``run.json``), the matrix and repros loaded again.
        ``cache_dir``: the cache in use now (the stored one, else the default found again)."""
        selection = Selection.restored(stored, where)
        matrix_path = stored.get("matrix")
        if not isinstance(matrix_path, str):
            raise UserError(where, "options.matrix", "names no matrix", "start a new run instead of resuming this one")
        matrix, discovery = load(Path(matrix_path), selection.repros_dirs)
        cache = CacheChoice.restored(stored, where)
        reports = stored.get("reports_dir")
        return cls(
            matrix=matrix,
            discovery=discovery,
            selection=selection,
            stack=StackChoice.restored(stored, where),
            executor=ExecutorChoice.restored(stored, where),
            attempts=AttemptPolicy.restored(stored, where),
            cache=cache.evolve(resolved=cache_dir),
            out_dir=out_dir,
            reports_dir=Path(reports) if isinstance(reports, str) else Path("reports"),
            shard_items=shard_items,
            explore=bool(stored.get("explore", False)),
        )


def check_repros_dirs(repros_dirs: Sequence[Path]) -> list[Path]:
    for directory in repros_dirs:
        check_path("--repros-dir", Path(directory))
        if not Path(directory).is_dir():
            raise UserError(directory, "--repros-dir", "is not a directory", "pass the directory of your repro files")
    return [Path(d).resolve() for d in repros_dirs]


def load(matrix: Path | None, repros_dirs: Sequence[Path] = (), cwd: Path | None = None) -> tuple[Matrix, Discovery]:
    """The matrix and the repros it can name (built-in, installed packages', ``--repros-dir``, the
    matrix's ``repros_dirs`` and ``$FT_REGRESS_REPROS``)."""
    given = check_repros_dirs(repros_dirs)
    path = find_matrix(matrix, cwd)
    content = read_matrix_file(path)
    discovery = discover([*given, *declared_repros_dirs(path, content)])
    loaded = load_matrix(path, discovery.repros.keys(), MODES, broken=discovery.broken, content=content)
    return loaded, discovery
