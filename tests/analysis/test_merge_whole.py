"""``merge`` leaves its output whole or not at all, and an item recorded twice in a run is counted
once (the last record) and said by every reader: ``merge``, ``compare`` and the report."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest

from harness.analysis.compare import REPEATED, compare_runs, markdown
from harness.analysis.merge import merge_runs
from harness.core.errors import UserError
from harness.records.item import ItemRecord
from harness.records.results import ResultsWriter
from harness.records.run_dir import RunDir
from harness.records.run_meta import RunMeta
from harness.reports import html
from harness.reports.finished import FinishedRun
from tests.support.report_fixture import records, write_run


def _shards(root: Path) -> list[Path]:
    every = records("s")
    return [
        write_run(root / "s1", "s1", "2026-11-20T10:00:00+00:00", [{**r, "run_id": "s1"} for r in every[:4]]),
        write_run(root / "s2", "s2", "2026-11-20T10:00:00+00:00", [{**r, "run_id": "s2"} for r in every[4:]]),
    ]


def _nothing_left(root: Path, out: Path) -> None:
    assert not out.exists()
    assert [p.name for p in root.iterdir() if p.name.startswith(".")] == []  # no staging directory either


def test_a_merge_that_fails_writing_leaves_no_output_and_says_so_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shards = _shards(tmp_path)
    out = tmp_path / "merged"

    def full_disk(self: RunDir, meta: RunMeta) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(RunDir, "write_meta", full_disk)
    with pytest.raises(UserError) as refused:
        merge_runs(out, shards)
    assert "No space left on device" in str(refused.value) and "merge again" in str(refused.value)
    _nothing_left(tmp_path, out)
    monkeypatch.undo()
    merged = merge_runs(out, shards)  # run again, it succeeds
    assert len(merged.records) == len(records("s")) and len(RunDir(out).records()) == len(records("s"))


@pytest.mark.parametrize("after", [0, 3, 7])
def test_a_merge_interrupted_midway_leaves_no_half_written_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, after: int
) -> None:
    shards = _shards(tmp_path)
    out = tmp_path / "merged"
    append = ResultsWriter.append
    written: list[int] = []

    def interrupted(self: ResultsWriter, record: ItemRecord) -> None:
        if len(written) == after:
            raise KeyboardInterrupt
        written.append(1)
        append(self, record)

    monkeypatch.setattr(ResultsWriter, "append", interrupted)
    with pytest.raises(KeyboardInterrupt):
        merge_runs(out, shards)
    _nothing_left(tmp_path, out)


def _repeat_a_line(run: Path, line: int, **changes: Any) -> None:
    lines = (run / "results.jsonl").read_text().splitlines()
    again = {**json.loads(lines[line]), **changes}
    (run / "results.jsonl").write_text("\n".join([*lines, json.dumps(again)]) + "\n")


def test_merge_counts_a_shards_repeated_record_once_and_says_so(tmp_path: Path) -> None:
    shards = _shards(tmp_path)
    _repeat_a_line(shards[0], 1, wall_s=99.0)
    merged = merge_runs(tmp_path / "merged", shards)
    assert len(merged.records) == len(records("s"))
    (repeat,) = [
        r
        for r in merged.records
        if r.key
        == tuple(
            json.loads((shards[0] / "results.jsonl").read_text().splitlines()[1])[k] for k in ("cell", "repro", "mode")
        )
    ]
    assert repeat.wall_s == 99.0  # the last record of it
    assert any("line 5" in w and "again" in w for w in merged.warnings)
    assert json.loads((tmp_path / "merged" / "run.json").read_text())["repeated_records"]


def test_compare_counts_a_repeated_record_once_and_says_so(tmp_path: Path) -> None:
    old = write_run(tmp_path / "old", "old", "2026-11-19T10:00:00+00:00", records("old"))
    new = write_run(tmp_path / "new", "new", "2026-11-20T10:00:00+00:00", records("new"))
    _repeat_a_line(old, 0)
    changes = compare_runs(RunDir(old).records(), RunDir(new).records())
    (said,) = [c for c in changes if c.kind == REPEATED]
    assert said.item == "old run" and "line 9" in said.detail
    assert [c.kind for c in changes if c.kind != REPEATED] == []  # nothing else changed
    assert "record repeated (1)" in markdown(changes, "old", "new")


def test_the_report_counts_a_repeated_record_once_and_says_so(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", "run", "2026-11-20T10:00:00+00:00", records("run"))
    _repeat_a_line(run, 0)
    page = html.write(FinishedRun.load(RunDir(run))).read_text()
    total = len(records("run"))
    assert f"of {total} items matched" in page and f"of {total + 1} items" not in page
    assert "line 9 records current/F1/bug of run run again (also line 1): counted once" in page
