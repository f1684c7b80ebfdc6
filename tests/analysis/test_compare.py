"""compare: each kind of change classified; nothing inside the noise flagged."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from harness.analysis.compare import (
    ADDED,
    FIXED_TRAINER_BROKE,
    MEMORY_WORSE,
    NEW_ERROR_KIND,
    NEW_REGRESSION,
    NOW_MATCHES,
    REMOVED,
    TIME_BETTER,
    TIME_WORSE,
    UPSTREAM_FIXED,
    compare_runs,
    markdown,
)
from harness.records.item import ItemRecord, parse_record
from harness.records.results import ResultsWriter
from tests.support.paths import REPO_ROOT

MIB = 2**20


def rec(
    cell: str,
    mode: str,
    outcome: str,
    matched: bool = True,
    mem: int = 400 * MIB,
    median: float = 0.100,
    iqr: float = 0.010,
    error: str | None = None,
    **extra: Any,
) -> ItemRecord:
    return parse_record(
        {
            "schema_version": 1,
            "run_id": "RUN",
            "cell": cell,
            "repro": "F1",
            "mode": mode,
            "outcome": outcome,
            "signature": None,
            "matched": matched,
            "expected": outcome,
            "peak_mem_bytes": mem,
            "peak_mem_kind": "cpu_peak_rss",
            "step_time_s": {"median": median, "iqr": iqr, "min": median, "max": median, "n": 4},
            "error": {"type": error, "message": f"{error} happened", "rank": 0} if error else None,
            "versions": {"deepspeed": "0.19.2"},
            "world_size": 2,
            "device": "cpu",
            "wall_s": 1.0,
            "reasons": [],
            "guards": [],
            "env": None,
            "repro_cmd": "python -m harness run",
            "started_at": "2026-01-01T00:00:00Z",
            "finished_at": "2026-01-01T00:00:01Z",
            **extra,
        }
    )


def kinds(changes) -> dict[str, str]:
    return {c.item: c.kind for c in changes}


def test_identical_runs_and_noise_give_no_change() -> None:
    old = [rec("a", "bug", "NOT_REPRODUCED"), rec("a", "fixed", "PASS")]
    new = [rec("a", "bug", "NOT_REPRODUCED", mem=405 * MIB, median=0.104), rec("a", "fixed", "PASS", median=0.117)]
    # +1% memory and +4%/+17% step time, the latter within twice the IQR of 10 ms.
    assert compare_runs(old, new) == []
    assert "No changes" in markdown([], "old", "new")


def test_each_outcome_change_gets_its_class() -> None:
    old = [
        rec("a", "bug", "REPRODUCED"),
        rec("a", "fixed", "PASS"),
        rec("b", "bug", "REPRODUCED", matched=False),
        rec("c", "bug", "DIFFERENT_ERROR", error="RuntimeError"),
        rec("gone", "bug", "REPRODUCED"),
    ]
    new = [
        rec("a", "bug", "NOT_REPRODUCED", matched=False, versions={"deepspeed": "0.19.3"}),
        rec("a", "fixed", "FAIL", matched=False, reasons=["rank 0: loss did not decrease"]),
        rec("b", "bug", "REPRODUCED", matched=True),
        rec("c", "bug", "DIFFERENT_ERROR", error="ValueError"),
        rec("new", "bug", "REPRODUCED"),
    ]
    changes = compare_runs(old, new)
    by_kind: dict[str, list[str]] = {}
    for change in changes:
        by_kind.setdefault(change.kind, []).append(change.item)
    assert by_kind[NEW_REGRESSION] == ["a/F1/bug", "a/F1/fixed"]
    assert by_kind[FIXED_TRAINER_BROKE] == ["a/F1/fixed"]
    assert by_kind[UPSTREAM_FIXED] == ["a/F1/bug"]
    assert by_kind[NOW_MATCHES] == ["b/F1/bug"]
    assert by_kind[NEW_ERROR_KIND] == ["c/F1/bug"]
    assert by_kind[ADDED] == ["new/F1/bug"] and by_kind[REMOVED] == ["gone/F1/bug"]
    upstream = next(c for c in changes if c.kind == UPSTREAM_FIXED)
    assert "deepspeed 0.19.2 -> 0.19.3" in upstream.detail
    text = markdown(changes, "night-1", "night-2")
    assert "**2 new regressions**" in text and "### new regression (2)" in text


def test_a_pinned_upgrade_is_compared_with_the_cell_it_came_from() -> None:
    old = [rec("current", "bug", "NOT_REPRODUCED"), rec("current", "fixed", "PASS")]
    new = [
        # run --pin peft==0.22.0: the cell is renamed; one record names its origin, one predates the field.
        rec("current+peft-0.22.0", "bug", "DIFFERENT_ERROR", matched=False, error="ImportError", cell_origin="current"),
        rec("current+peft-0.22.0", "fixed", "FAIL", matched=False),
    ]
    by_kind: dict[str, list[str]] = {}
    for change in compare_runs(old, new):
        by_kind.setdefault(change.kind, []).append(change.item)
    pinned = ["current+peft-0.22.0 (against current)/F1/bug", "current+peft-0.22.0 (against current)/F1/fixed"]
    assert by_kind[NEW_REGRESSION] == pinned
    assert by_kind[FIXED_TRAINER_BROKE] == pinned[1:] and ADDED not in by_kind and REMOVED not in by_kind
    # Both cells in one run: each is its own item, the pinned one added.
    assert kinds(compare_runs(old[:1], [rec("current", "bug", "NOT_REPRODUCED"), new[0]])) == {
        "current+peft-0.22.0/F1/bug": ADDED
    }


def test_performance_beyond_threshold_and_noise_is_flagged() -> None:
    old = [rec("a", "fixed", "PASS", mem=400 * MIB, median=0.100, iqr=0.005)]
    new = [rec("a", "fixed", "PASS", mem=480 * MIB, median=0.160, iqr=0.005)]
    assert sorted(c.kind for c in compare_runs(old, new)) == sorted([MEMORY_WORSE, TIME_WORSE])
    faster = [rec("a", "fixed", "PASS", median=0.050, iqr=0.005)]
    assert kinds(compare_runs(old, faster)) == {"a/F1/fixed": TIME_BETTER}
    # A small absolute memory change stays under the floor even if relatively large.
    tiny_old = [rec("a", "fixed", "PASS", mem=20 * MIB)]
    tiny_new = [rec("a", "fixed", "PASS", mem=30 * MIB)]
    assert compare_runs(tiny_old, tiny_new) == []


def test_cpu_memory_is_not_compared_across_launchers_but_step_time_is() -> None:
    old = [rec("a", "fixed", "PASS", mem=460 * MIB, median=0.100, iqr=0.005)]  # torchrun, before the field
    new = [rec("a", "fixed", "PASS", mem=400 * MIB, median=0.160, iqr=0.005, launcher="worker")]
    assert kinds(compare_runs(old, new)) == {"a/F1/fixed": TIME_WORSE}
    worse = [rec("a", "fixed", "PASS", mem=480 * MIB, median=0.160, iqr=0.005, launcher="worker")]
    assert kinds(compare_runs(new, worse)) == {"a/F1/fixed": MEMORY_WORSE}


def write_run(directory: Path, records: list[ItemRecord]) -> Path:
    directory.mkdir()
    with ResultsWriter(directory / "results.jsonl") as writer:
        for record in records:
            writer.append(record)
    return directory


def test_cli_exits_1_only_on_a_new_regression(tmp_path: Path) -> None:
    old = write_run(tmp_path / "old", [rec("a", "fixed", "PASS")])
    faster = write_run(tmp_path / "faster", [rec("a", "fixed", "PASS", median=0.020)])
    broken = write_run(tmp_path / "broken", [rec("a", "fixed", "FAIL", matched=False)])
    summary = tmp_path / "summary.md"
    for new, code in ((faster, 0), (broken, 1)):
        proc = subprocess.run(
            [sys.executable, "-m", "harness", "compare", str(old), str(new), "--markdown", str(summary)],
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,
        )
        assert proc.returncode == code, proc.stdout + proc.stderr
        assert summary.read_text() in proc.stdout  # the same markdown, printed and written
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "compare", str(old), str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 2 and "nope: is not a directory" in proc.stderr
