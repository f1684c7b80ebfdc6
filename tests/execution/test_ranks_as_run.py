"""The record describes the ranks that ran (issue 40, class 3): ranks whose repro told them another
world or rank than the launch are recorded as they ran, the launch beside it, and said; a rank's
full disk names the filesystem its write was refused on, never the item's with space to spare; a
signature pattern that backtracks without end is bounded and named as a runaway pattern, never
taken for a script that hangs."""

from __future__ import annotations

import os
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from harness.analysis.explain.logs import LoggedError
from harness.analysis.explain.match import NEAR, match_signature
from harness.config.repros import discover
from harness.execution.launchers.diagnose import machine_reason, mount_of
from harness.records.rank import parse_rank_record
from harness.records.run_dir import RunDir
from repros.runtime import patterns
from repros.runtime.record import RanAs, ran_as
from tests.support import throwaway_run

RUNAWAY = r"(?:(a|aa)+)+b\1"


def _run(tmp_path: Path, ranks_for: Any, *more: str, repros: str = "F1") -> Any:
    tmp_path.mkdir(parents=True, exist_ok=True)
    matrix = throwaway_run.write_matrix(tmp_path / "matrix.yaml", ["c0"], world_size=2)
    with throwaway_run.registered(ranks_for):
        throwaway_run.run(matrix, tmp_path / "run", tmp_path / "cache", *more, repros=repros)
    (record,) = RunDir(tmp_path / "run").records()
    return record


def test_the_rank_records_who_its_code_was_told_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert ran_as() == RanAs(rank=1, local_rank=1, world_size=2, source="environment")
    # A script's own `env:` (applied over torchrun's variables before it runs) is what it saw.
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    assert ran_as().world_size == 1 and ran_as().rank == 0


def test_ranks_told_another_world_are_recorded_as_they_ran_with_the_launch_beside(tmp_path: Path) -> None:
    def told_a_world_of_one(cell: str, rank: int) -> dict[str, Any]:
        return {**throwaway_run.clean_rank(cell, rank), "ran_as": {"rank": 0, "world_size": 1, "source": "environment"}}

    record = _run(tmp_path, told_a_world_of_one)
    assert record.world_size == 1 and record.world_size_launched == 2
    assert [r.ran_as_rank for r in record.ranks] == [None, 0]
    said = " ".join(record.reasons)
    assert "ran as a world of 1" in said and "launched as 2" in said
    assert "rank 1 as rank 0" in said and "two ranks ran as one" in said
    # Ranks that ran as launched add nothing.
    agreed = _run(
        tmp_path / "agreed",
        lambda cell, rank: {**throwaway_run.clean_rank(cell, rank), "ran_as": {"rank": rank, "world_size": 2}},
    )
    assert agreed.world_size == 2 and agreed.world_size_launched is None and agreed.reasons == []


def test_a_full_disk_is_named_where_the_write_was_refused(tmp_path: Path) -> None:
    item_dir = tmp_path / "run" / "items" / "c" / "F1-bug"
    item_dir.mkdir(parents=True)
    scratch = Path("/dev/shm") / f"ft-regress-test-{os.getpid()}" / "ckpt.bin"
    assert mount_of(scratch)[0] != mount_of(item_dir)[0], "the test needs /dev/shm on a filesystem of its own"
    error = {"type": "OSError", "message": f"[Errno 28] No space left on device: '{scratch}'"}
    records = {0: parse_rank_record({"rank": 0, "status": "error", "error": error})}
    reason = machine_reason(item_dir, None, [], records, tmp_path / "run")
    assert f"the filesystem at {mount_of(scratch)[0]} (tmpfs, holding {scratch})" in reason
    assert str(item_dir) not in reason.split(";")[0]
    # An error that names no file: which disk is not known, and the item's own is not blamed.
    unnamed = {"type": "OSError", "message": "[Errno 28] No space left on device"}
    records = {0: parse_rank_record({"rank": 0, "status": "error", "error": unnamed})}
    reason = machine_reason(item_dir, None, [], records, tmp_path / "run")
    assert reason.startswith("a disk a rank wrote to is full (its error names no file, so which one is not known)")
    assert f"the item's own, at {mount_of(item_dir)[0]}, has" in reason


def test_a_runaway_pattern_is_stopped_and_named_on_either_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    started = time.monotonic()
    with pytest.raises(patterns.PatternRunaway, match="backtracks without end"):
        patterns.search(RUNAWAY, "a" * 40)
    # Without the regex package (a cell may lack it), on the main thread: re, stopped by a timer.
    monkeypatch.setattr(patterns, "_engine", [None])
    with pytest.raises(patterns.PatternRunaway):
        patterns.search(RUNAWAY, "a" * 40, budget_s=0.5)
    assert time.monotonic() - started < 15
    assert patterns.search(r"^documented symptom$", "x\ndocumented symptom\ny")


def _runaway_repro(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "train.py").write_text("raise ValueError('a' * 40)\n")
    (directory / "repro.yaml").write_text(
        textwrap.dedent(
            f"""
            repro:
              id: runaway
              script: train.py
              fails_with: {{type: ValueError, pattern: '{RUNAWAY}'}}
            """
        )
    )


def test_a_runaway_signature_pattern_is_infra_naming_it_never_a_hang(tmp_path: Path) -> None:
    _runaway_repro(tmp_path / "mine")

    def raising(cell: str, rank: int) -> dict[str, Any]:
        error = {"type": "ValueError", "message": "a" * 40}
        return {**throwaway_run.clean_rank(cell, rank), "status": "error", "error": error}

    started = time.monotonic()
    record = _run(tmp_path, raising, "--repros-dir", str(tmp_path / "mine"), repros="runaway")
    assert time.monotonic() - started < 60
    assert record.outcome == "INFRA" and record.error is not None and record.error.type == "ValueError"
    (reason,) = record.reasons
    assert "signature runaway.declared" in reason and "a runaway pattern" in reason
    assert "the signature's pattern is at fault, not the script" in reason


def test_explain_names_a_runaway_pattern_instead_of_hanging(tmp_path: Path) -> None:
    _runaway_repro(tmp_path / "mine")
    (repro,) = [r for r in discover([tmp_path / "mine"]).repros.values() if r.id == "runaway"]
    (signature,) = repro.spec.signatures
    found = match_signature(repro, signature, LoggedError("ValueError", "a" * 40, 1))
    assert found.status == NEAR and "a runaway pattern" in found.why
