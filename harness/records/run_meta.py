"""``run.json``: what a run was (its options, provenance, cells, plan) and how it ended, typed.

Written only through ``RunDir.write_meta`` and read only through ``RunDir.read_meta``, which
validates it (a field of the wrong type is named, never trusted). A run's metadata is a value:
each change (a cell's environment ready, the run finished) makes a new one (``evolve``). Fields a
reader may rely on are typed here; what a command adds of its own (``grid``, ``costs``) or a newer
harness wrote is kept as written.
"""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import Mapping, Sequence
from typing import Self

from pydantic import BaseModel, ConfigDict, Field

from harness import __version__
from harness.core.invocation import program_text
from harness.core.json import JsonObject, JsonValue
from harness.records.provenance import git_commit, host_info


def new_run_id() -> str:
    """A run's id: when it started, to the second, and four hex digits (two runs in one second differ)."""
    return dt.datetime.now().strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)


def utc_now(timespec: str = "seconds") -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec=timespec)


class _Meta(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow")


class MatrixRef(_Meta):
    path: str
    sha256: str


class ExcludedItem(_Meta):
    """An item the matrix excludes, and why."""

    cell: str
    repro: str
    mode: str
    reason: str = ""

    @property
    def label(self) -> str:
        return f"{self.cell}/{self.repro}/{self.mode}"


class CellMeta(_Meta):
    """A cell's environment as the run found it (or why it had none), and its worker."""

    #: Why the cell has no environment (its items are UNRESOLVABLE).
    unavailable: str | None = None
    #: The cell's package specs, as the matrix (and ``--pin``) asked.
    requested: dict[str, str] = Field(default_factory=dict)
    key: str | None = None
    provider: str | None = None
    reused: bool | None = None
    build_s: float | None = None
    #: Where it was built by this run: the CPU seconds its installer used (downloads, installs).
    build_cpu_s: float | None = None
    python: str | None = None
    #: Every installed distribution and its version.
    packages: dict[str, str] = Field(default_factory=dict)
    extensions_dir: str | None = None
    repaired: str | None = None
    #: A floating cell's packages whose spec floats (resolved afresh for the run), and what everything
    #: resolved to: ``name==version`` lines (a cell of exact pins has none: ``packages`` says it all).
    floating: list[str] = Field(default_factory=list)
    lock: list[str] = Field(default_factory=list)
    #: How the floating specs were resolved: as of, the seconds it took, what was exempted or capped.
    resolution: dict[str, JsonValue] | None = None
    #: Its pre-imported worker: seconds to ready, its imports and their CPU seconds (``run.json`` only).
    worker: dict[str, JsonValue] | None = None


class ShardMeta(_Meta):
    """``run --shard I/N``: the whole plan and this shard's part, for ``merge`` to check."""

    index: int
    count: int
    items: list[str]
    planned_all: list[str]
    balanced_by: dict[str, JsonValue] = Field(default_factory=dict)


class RunMeta(_Meta):
    run_id: str = ""
    #: Which command wrote the run: ``run``, ``grid``, ``costs``; merged runs and pytest sessions too.
    kind: str = "run"
    #: To the millisecond: a repro file changed just before the run can be told from one changed during it
    #: (``run --save-expectations`` reuses a run only where none of its files changed since it started).
    started_at: str | None = None
    finished_at: str | None = None
    resumed_at: list[str] = Field(default_factory=list)
    #: Why the run stopped early (``SIGINT``, ``SIGTERM``), where it did.
    interrupted: str | None = None
    #: A record or report that could not be written (a full disk).
    write_error: str | None = None
    #: A usage error that ended the run once it had started (its executor could not start), in one line.
    failed: str | None = None
    #: Items whose attempts (``--repeat``, ``--reruns``) had begun to finish when the run stopped, and
    #: have no record yet: each finished attempt's directory, holding its own record (``attempt.json``);
    #: ``--resume`` goes on from them. Empty once every such item is recorded.
    unrecorded_attempts: dict[str, list[str]] = Field(default_factory=dict)
    argv: list[str] = Field(default_factory=list)
    program: str = ""
    #: The run's options, every concern's fields side by side, as ``RunOptions.stored`` writes them
    #: (``harness/planning/run_options.py``); ``run --resume`` restores them with ``RunOptions.restored``.
    options: JsonObject | None = None
    harness_version: str | None = None
    git_commit: str | None = None
    matrix: MatrixRef | None = None
    lane: str | None = None
    #: The day floating specs were resolved as of (``--as-of``); None: the run's own time.
    as_of: str | None = None
    host: dict[str, JsonValue] = Field(default_factory=dict)
    cache_dir: str | None = None
    index: dict[str, JsonValue] = Field(default_factory=dict)
    #: Every planned item's label (cell/repro/mode).
    planned: list[str] = Field(default_factory=list)
    excluded: list[ExcludedItem] = Field(default_factory=list)
    broken_repros: dict[str, str] = Field(default_factory=dict)
    cells: dict[str, CellMeta] = Field(default_factory=dict)
    shard: ShardMeta | None = None
    concurrency: dict[str, JsonValue] | None = None
    #: How the cells' environments were made ready (``harness/pipeline/environment_stage.py``): the
    #: order, how many at once, when each started and was ready (seconds from the run's start), and
    #: how long no item ran because none had its environment yet (``waited_s``).
    environment_stage: dict[str, JsonValue] | None = None
    #: When the run's first record was written (to the millisecond).
    first_record_at: str | None = None
    orchestrator_peak_rss_bytes: int | None = None

    @classmethod
    def started(cls, run_id: str, argv: Sequence[str], **fields: object) -> Self:
        """``run.json`` as a run (or a pytest session) starts: ``fields`` (its options, its plan,
        its environments' cache), and where and what it ran from: the time, the program the user
        ran, the harness's version and commit, the host."""
        return cls.model_validate(
            {
                "run_id": run_id,
                "started_at": utc_now("milliseconds"),
                "argv": list(argv),
                "program": program_text(),
                "harness_version": __version__,
                "git_commit": git_commit(),
                "host": host_info(),
                **fields,
            }
        )

    def __contains__(self, item: object) -> bool:
        """``"field" in record`` would compare with pydantic's (name, value) pairs and say False:
        refuse it, so no check passes without checking anything."""
        raise TypeError(f"{type(self).__name__} has attributes, not keys: read the field, or use as_json()")

    def evolve(self, **changes: object) -> Self:
        """A new value: this one with ``changes``, validated like any read back."""
        plain = {
            k: v.model_dump(mode="json", exclude_unset=True) if isinstance(v, BaseModel) else v
            for k, v in changes.items()
        }
        return type(self).model_validate({**self.as_json(), **plain})

    def with_cell(self, name: str, cell: CellMeta) -> Self:
        return self.evolve(cells={**self.cells, name: cell})

    def as_json(self) -> dict[str, JsonValue]:
        return self.model_dump(mode="json", exclude_unset=True)

    def cell_versions(self, cell: str) -> Mapping[str, str]:
        found = self.cells.get(cell)
        return found.packages if found else {}
