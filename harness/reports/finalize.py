"""What every finished (or stopped) run directory gets, whoever wrote it: ``run``, ``merge``,
``report``, ``--resume`` and the pytest plugin all end with ``finalize``.

The report writers are registered in ``WRITERS``: each reads the run's records and
``run.json`` and writes one file into the run directory. A new report is one module with a
``write(run: FinishedRun) -> Path`` function, plus its line here, or an installed package's entry
point in the ``ft_regress.writers`` group (``repros/runtime/registry.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.records.run_dir import RunDir
from harness.reports import html as html_report
from harness.reports import junit
from harness.reports.finished import FinishedRun
from repros.runtime.registry import Registry

ReportWriter = Callable[[FinishedRun], Path]

#: Every report a finished run gets, by name (read at each finalize: a writer registered later is used too).
WRITERS: Registry[ReportWriter] = Registry(
    "report writer", {"junit": junit.write, "html": html_report.write}, group="ft_regress.writers"
)


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
    for name, writer in WRITERS.items():
        try:
            written.append(writer(run))
        except OSError as exc:
            failed.append(f"the {name} report: {exc.strerror or exc} ({exc.filename or run_dir.path})")
            for partial in run_dir.path.glob("*.tmp"):
                partial.unlink(missing_ok=True)
    return Finalized(written, failed)
