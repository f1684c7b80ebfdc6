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


@dataclass(frozen=True)
class Finalized:
    written: list[Path]
    #: The reports that could not be written (a full disk), each with why.
    failed: list[str]


def finalize(run_dir: RunDir) -> Finalized:
    """Write every registered report of ``run_dir``. A report that cannot be written is named in
    ``failed`` (the records and the other reports are kept); ``report DIR`` writes it again."""
    run = FinishedRun.load(run_dir)
    written: list[Path] = []
    failed: list[str] = []
    for writer in WRITERS:
        try:
            written.append(writer(run))
        except OSError as exc:
            name = getattr(writer, "__module__", "a report")
            failed.append(f"{name}: {exc.strerror or exc} ({exc.filename or run_dir.path})")
            for partial in run_dir.path.glob("*.tmp"):
                partial.unlink(missing_ok=True)
    return Finalized(written, failed)
