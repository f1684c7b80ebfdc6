"""The HTML report at scale, measured: ``python -m harness bench report --items 10000``.

Writes a synthetic run directory of N item records (the real ``ItemRecord`` and the real
writers: ``RunDir``, ``ResultsWriter``, ``RunMeta``), with a previous run beside it for the
history, renders its ``index.html`` with the report writer every run ends with, and prints (one
JSON object): the seconds to load the run and write the page, the page's size, and, where a
Chromium is found (``--chromium``, ``$CHROMIUM``, ``chromium`` on the path), the milliseconds a
headless Chromium took from navigation to the page's script done (``ready_ms``: the whole page
parsed and the script run) and to the load event (``load_ms``), and the browser's whole wall
time against an empty page's.

The run is what a nightly looks like: N/(2 x ``--repros``) cells, each repro in bug and fixed
mode, every item matched but one in each of ``--failing-cells`` cells (those change since the
previous run too), a few combinations excluded, each rank's log tail about a kilobyte.
``--failing-cells`` equal to the number of cells folds nothing: the page's worst case.
Nothing here is a test: the tests count what grows (``tests/reports/test_report_folding.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from html.parser import HTMLParser
from pathlib import Path

from rich.console import Console

from harness.core.json import JsonObject
from harness.records.item import ItemRecord, parse_record
from harness.records.run_dir import RunDir
from harness.records.run_meta import RunMeta
from harness.reports import html
from harness.reports.finished import FinishedRun

MIB = 2**20
#: One rank's log tail: a kilobyte or so, as a short training run's last lines are.
LOG_TAIL = "\n".join(
    f"step {i:3d} loss {2.5 - i * 0.01:.4f} lr 1.0e-04 grad_norm {0.9 + i * 0.001:.3f}" for i in range(20)
)


def _record(run_id: str, cell: str, repro: str, mode: str, failing: bool) -> ItemRecord:
    bug = mode == "bug"
    expected = "REPRODUCED" if bug else "PASS"
    outcome = ("DIFFERENT_ERROR" if bug else "FAIL") if failing else expected
    error = None
    if failing or bug:
        message = "Recomputed values have shape [0]" if not failing else "expected a gradient on lora_B.weight"
        error = {
            "type": "RuntimeError" if failing else "CheckpointError",
            "message": message,
            "rank": 0,
            "traceback": "Traceback (most recent call last):\n"
            + '  File "trainer.py", line 1, in step\n' * 12
            + message,
        }
    raw: JsonObject = {
        "schema_version": 1,
        "run_id": run_id,
        "cell": cell,
        "repro": repro,
        "mode": mode,
        "outcome": outcome,
        "signature": f"{repro}.documented" if bug and not failing else None,
        "expected": expected,
        "expected_when": {"deepspeed": "<0.19.3"},
        "expected_established_by": f"python -m harness run --cells {cell} --repros {repro}",
        "matched": not failing,
        "versions": {"python": "3.11.7", "torch": "2.13.0", "deepspeed": "0.19.2", "peft": "0.21.2"},
        "world_size": 2,
        "device": "cpu",
        "backend": "gloo",
        "peak_mem_bytes": 900 * MIB,
        "peak_mem_kind": "cpu_peak_rss",
        "peak_mem_bytes_per_rank": {"0": 900 * MIB, "1": 880 * MIB},
        "step_time_s": {"median": 0.21, "min": 0.2, "max": 0.23, "iqr": 0.004, "n": 6},
        "wall_s": 31.5,
        "error": error,
        "reasons": ["rank 0: lora_B.weight got no gradient"] if failing and not bug else [],
        "guards": [] if bug else [{"id": "ds-zero3-ckpt-reentrant", "reason": "deepspeed<0.19.3 recomputes"}],
        "ranks": [
            {"rank": r, "status": "ok", "phase": "done", "exitcode": 0, "error_type": None, "log_tail": LOG_TAIL}
            for r in (0, 1)
        ],
        "env": {
            "key": f"key-{cell}",
            "path": f"/cache/envs/key-{cell}",
            "python": "/cache/python",
            "reused": True,
            "build_s": 0.0,
        },
        "repro_cmd": f"python -m harness run --matrix matrix.yaml --cells {cell} --repros {repro} --modes {mode}",
        "item_dir": f"/tmp/run/items/{cell}/{repro}-{mode}",
        "started_at": "2026-11-20T10:00:00+00:00",
        "finished_at": "2026-11-20T10:00:31+00:00",
    }
    return parse_record(raw)


def write_run(
    directory: Path, run_id: str, started_at: str, items: int, repros: int = 100, failing_cells: int = 5
) -> Path:
    """A run directory of ``items`` records (rounded down to whole cells), written as a run writes
    it; the first ``failing_cells`` cells have one item that did not match, and every tenth cell
    has a combination excluded."""
    cells = max(1, items // (2 * repros))
    run = RunDir.create(directory)
    planned, excluded = [], []
    with run.writer() as writer:
        for c in range(cells):
            cell = f"cell{c}"
            for r in range(1, repros + 1):
                for mode in ("bug", "fixed"):
                    failing = c < failing_cells and r == 3 and mode == "fixed"
                    writer.append(_record(run_id, cell, f"F{r}", mode, failing))
                    planned.append(f"{cell}/F{r}/{mode}")
            if c % 10 == 0:  # a repro the matrix excludes from every tenth cell, with its reason
                excluded.append(
                    {"cell": cell, "repro": f"F{repros + 1}", "mode": "bug", "reason": "needs transformers 5"}
                )
    meta = {
        "run_id": run_id,
        "started_at": started_at,
        "finished_at": started_at,
        "argv": ["run", "--lane", "nightly"],
        "lane": "nightly",
        "planned": planned,
        "excluded": excluded,
    }
    run.write_meta(RunMeta.model_validate(meta))
    return directory


def _chromium_path(given: str | None) -> str | None:
    found = given or os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    return found if Path(found).exists() else None


def open_in_chromium(chromium: str, url: str, timeout: float = 300) -> tuple[float, str]:
    """Headless Chromium's wall seconds to open ``url`` and dump its DOM, and the DOM."""
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        started = time.perf_counter()
        done = subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--host-resolver-rules=MAP * ~NOTFOUND",
                f"--user-data-dir={profile}",
                "--window-size=1400,2400",
                "--dump-dom",
                url,
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        return time.perf_counter() - started, done.stdout


class _Body(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.attrs: dict[str, str | None] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "body":
            self.attrs = dict(attrs)


def measure(
    items: int, root: Path, repros: int = 100, failing_cells: int = 5, chromium: str | None = None
) -> JsonObject:
    """Write the two runs under ``root``, the report of the newer one, and open it."""
    started = time.perf_counter()
    write_run(root / "run-a", "run-a", "2026-11-19T10:00:00+00:00", items, repros, failing_cells=0)
    current = write_run(root / "run-b", "run-b", "2026-11-20T10:00:00+00:00", items, repros, failing_cells)
    records_s = time.perf_counter() - started
    started = time.perf_counter()
    finished = FinishedRun.load(RunDir(current))
    load_s = time.perf_counter() - started
    started = time.perf_counter()
    page = html.write(finished)
    write_s = time.perf_counter() - started
    figures: JsonObject = {
        "items": len(finished.records),
        "cells": len({r.cell for r in finished.records}),
        "failing_cells": failing_cells,
        "records_written_s": round(records_s, 2),
        "load_s": round(load_s, 2),
        "write_s": round(write_s, 2),
        "page_bytes": page.stat().st_size,
        "page_mb": round(page.stat().st_size / 2**20, 2),
    }
    browser = _chromium_path(chromium)
    if browser is None:
        figures["chromium"] = "not found: pass --chromium PATH"
        return figures
    empty = root / "empty.html"
    empty.write_text("<!DOCTYPE html><html><body></body></html>")
    baseline_s, _ = open_in_chromium(browser, empty.as_uri())
    wall_s, dom = open_in_chromium(browser, page.as_uri())
    body = _Body()
    body.feed(dom)
    figures.update(
        chromium_ready_ms=_int(body.attrs.get("data-ready-ms")),
        chromium_load_ms=_int(body.attrs.get("data-load-ms")),
        chromium_wall_s=round(wall_s, 2),
        chromium_empty_page_wall_s=round(baseline_s, 2),
        script_error=body.attrs.get("data-script-error"),
        matrix_entries=_int(body.attrs.get("data-report-ready")),
    )
    return figures


def _int(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


def run_report_page(
    items: int, repros: int, failing_cells: int, chromium: str | None, keep: Path | None, console: Console
) -> int:
    """Measure the page for ``items`` items and print the figures (one JSON object). ``keep``: write
    the runs there and keep them; else in a temporary directory, in memory where there is a tmpfs
    (the results writer syncs each record to disk)."""
    if keep:
        figures = measure(items, keep, repros, failing_cells, chromium)
    else:
        shm = Path("/dev/shm")
        where = str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None
        with tempfile.TemporaryDirectory(prefix="report-scale-", dir=where) as tmp:
            figures = measure(items, Path(tmp), repros, failing_cells, chromium)
    console.print(json.dumps(figures), highlight=False, markup=False)
    return 0
