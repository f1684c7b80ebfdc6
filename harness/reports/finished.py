"""A finished (or stopped) run, as every report writer reads it: its directory, its records and
its ``run.json``."""

from __future__ import annotations

from dataclasses import dataclass

from harness.records.changes import Change, ChangesFileError, read_changes
from harness.records.item import ItemRecord
from harness.records.run_dir import RunDir
from harness.records.run_meta import ExcludedItem, RunMeta


@dataclass(frozen=True)
class FinishedRun:
    dir: RunDir
    records: list[ItemRecord]
    meta: RunMeta
    #: A ``watch`` run's ``changes.json`` (None: not a watch run, or not classified yet).
    changes: list[Change] | None = None
    #: Why ``changes.json`` could not be read, where it could not.
    changes_problem: str | None = None

    @classmethod
    def load(cls, run_dir: RunDir) -> FinishedRun:
        try:
            changes, problem = read_changes(run_dir.path), None
        except ChangesFileError as exc:
            changes, problem = None, str(exc)
        return cls(run_dir, run_dir.records(), run_dir.read_meta(), changes, problem)

    @property
    def excluded(self) -> list[ExcludedItem]:
        return list(self.meta.excluded)
