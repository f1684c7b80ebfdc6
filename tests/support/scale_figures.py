"""Figures at scale, printed (not a test: nothing here is timed against a limit).

    python -m tests.support.scale_figures report 10000   # the HTML report of N synthetic items
    python -m tests.support.scale_figures run 10000      # a real `run` of N cells, one item each

``report``: a run directory of N items (N/10 cells x 10 repros, every outcome, a second run beside
it for the history), rendered by ``harness.reports.html.write``. ``run``: the command line's
``run`` over N cells with the throwaway provider and launcher (``tests/support/throwaway_run.py``),
counting how often ``run.json`` is written. Each prints seconds, the process's peak resident
memory (MB, ``ru_maxrss``) and, for ``run``, items a minute and the writes of ``run.json``; run each
in its own process so the peaks are its own.
"""

from __future__ import annotations

import argparse
import io
import json
import resource
import sys
import tempfile
import time
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

from tests.support.report_fixture import records as fixture_records
from tests.support.report_fixture import write_run


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def synthetic_records(count: int, run_id: str) -> list[dict[str, Any]]:
    """``count`` records over ``count // 10`` cells and 10 repros, cycling through the fixture's kinds."""
    kinds = fixture_records(run_id)
    out = []
    for i in range(count):
        base = dict(kinds[i % len(kinds)])
        base.update(cell=f"cell{i // 10:05d}", repro=f"R{i % 10}", mode=base["mode"], run_id=run_id)
        out.append(base)
    return out


def report(count: int, root: Path) -> dict[str, float]:
    from harness.records.run_dir import RunDir
    from harness.reports import html
    from harness.reports.finished import FinishedRun

    write_run(root / "run-a", "run-a", "2026-11-19T10:00:00+00:00", synthetic_records(count, "run-a"))
    current = write_run(root / "run-b", "run-b", "2026-11-20T10:00:00+00:00", synthetic_records(count, "run-b"))
    before = _peak_mb()
    started, cpu = time.perf_counter(), time.process_time()
    path = html.write(FinishedRun.load(RunDir(current)))
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    return {
        "items": count,
        "seconds": round(seconds, 2),
        "cpu_seconds": round(cpu, 2),
        "peak_mb": round(_peak_mb(), 1),
        "peak_mb_before_report": round(before, 1),
        "page_mb": round(path.stat().st_size / 2**20, 1),
    }


def run(count: int, root: Path) -> dict[str, float]:
    import pytest

    from harness.records.run_dir import RunDir
    from tests.support import throwaway_run

    writes = 0
    write_meta = RunDir.write_meta

    def counted(self: RunDir, meta: Any) -> None:
        nonlocal writes
        writes += 1
        write_meta(self, meta)

    cells = [f"c{i}" for i in range(count)]
    matrix = throwaway_run.write_matrix(root / "matrix.yaml", cells, world_size=1)
    started, cpu = time.perf_counter(), time.process_time()
    with pytest.MonkeyPatch.context() as patch, throwaway_run.registered(), redirect_stdout(io.StringIO()):
        patch.setattr(RunDir, "write_meta", counted)
        status = throwaway_run.run(matrix, root / "out", root / "cache")
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    done = len(RunDir(root / "out").records())
    return {
        "cells": count,
        "status": status,
        "records": done,
        "seconds": round(seconds, 2),
        "cpu_seconds": round(cpu, 2),
        "items_per_minute": round(done / seconds * 60),
        "run_json_writes": writes,
        "run_json_kb": round((root / "out" / "run.json").stat().st_size / 1024, 1),
        "peak_mb": round(_peak_mb(), 1),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["report", "run"])
    parser.add_argument("count", type=int, nargs="?", default=10_000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        figures = (report if args.what == "report" else run)(args.count, Path(tmp))
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
