"""What every finished (or stopped) run directory gets, whoever wrote it: ``run``, ``merge``,
``report``, ``--resume`` and the pytest plugin all end with ``finalize``.

The report writers are registered in ``WRITERS``: each reads the run's records and
``run.json`` and writes one file into the run directory. A new report is one module with a
``write(run: FinishedRun) -> Path`` function, plus its line here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness import html_report, junit
from harness.records import ItemRecord
from harness.run_dir import RunDir, RunMeta


@dataclass(frozen=True)
class FinishedRun:
    dir: RunDir
    records: list[ItemRecord]
    meta: RunMeta

    @classmethod
    def load(cls, run_dir: RunDir) -> FinishedRun:
        return cls(run_dir, run_dir.records(), run_dir.read_meta())

    @property
    def excluded(self) -> list[dict[str, str]]:
        return [e for e in self.meta.get("excluded") or [] if isinstance(e, dict)]


ReportWriter = Callable[[FinishedRun], Path]

WRITERS: tuple[ReportWriter, ...] = (junit.write, html_report.write)


def finalize(run_dir: RunDir) -> list[Path]:
    """Write every registered report of ``run_dir``; return their paths."""
    run = FinishedRun.load(run_dir)
    return [writer(run) for writer in WRITERS]
