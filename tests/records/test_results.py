"""Merging rank records into item records, and the results file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.config.expectations import expectation_for
from harness.core.errors import UserError
from harness.environments import Environment
from harness.execution.classify import Observation
from harness.execution.launchers.result import LaunchResult
from harness.execution.metrics import max_over_ranks, slowest_rank_per_step, summarise
from harness.pipeline.item_records import item_record
from harness.records.item import ItemId, ItemRecord, parse_record
from harness.records.rank import RankRecord
from harness.records.results import ResultsWriter, read_results
from repros.catalog.f1_zero3_frozen_ckpt import SPEC as F1
from repros.runtime.outcomes import Outcome
from tests.support.rank_records import rank_record

DESIGN_FIELDS = {
    "schema_version",
    "run_id",
    "cell",
    "repro",
    "mode",
    "outcome",
    "expected",
    "matched",
    "versions",
    "world_size",
    "device",
    "peak_mem_bytes",
    "peak_mem_kind",
    "step_time_s",
    "wall_s",
    "error",
    "repro_cmd",
}


def env(deepspeed: str = "0.19.2") -> Environment:
    return Environment(
        key="k",
        python="/x/python",
        python_version="3.11.7",
        packages={"torch": "2.13.0+cpu", "deepspeed": deepspeed, "peft": "0.21.2"},
        path="/x",
        extensions_dir="/e",
        reused=True,
        build_s=0.0,
    )


def rec(rank: int, steps: list[float], peak: int) -> RankRecord:
    return rank_record(
        rank,
        "ok",
        device="cpu",
        backend="gloo",
        warmup_steps=1,
        measures={
            "step_time": {"kind": "wall", "per_step": steps},
            "peak_mem": {"kind": "cpu_peak_rss", "value": peak},
        },
        facts={"guards": [{"id": "use-cache-off", "reason": ""}], "train": {"losses": [2.0, 1.0]}},
    )


def test_step_time_takes_the_slowest_rank_per_step_after_warm_up() -> None:
    summary = slowest_rank_per_step([rec(0, [9.0, 0.1, 0.3, 0.2], 1), rec(1, [8.0, 0.2, 0.1, 0.4], 1)], "step_time")
    # per-step maxima after warm-up: 0.2, 0.3, 0.4
    assert summary is not None and summary.n == 3
    assert abs(summary.median - 0.3) < 1e-9 and summary.min == 0.2 and summary.max == 0.4
    assert abs(summary.iqr - 0.1) < 1e-9


def test_no_steps_gives_no_step_time() -> None:
    assert slowest_rank_per_step([rec(0, [], 1)], "step_time") is None
    assert slowest_rank_per_step([rec(0, [0.5], 1)], "step_time") is None
    nothing = summarise([])["step_time"]
    assert nothing.value is None and nothing.steps is None


def test_peak_memory_is_the_maximum_over_ranks() -> None:
    figure = max_over_ranks([rec(0, [], 100), rec(1, [], 300)], "peak_mem")
    assert (figure.value, figure.kind, figure.per_rank) == (300, "cpu_peak_rss", {"0": 100, "1": 300})
    figures = summarise([rec(0, [], 100), rec(1, [], 300)])
    assert figures["peak_mem"].value == 300 and figures["peak_mem"].per_rank == {"0": 100, "1": 300}


def test_expectations_follow_resolved_versions_including_local_labels() -> None:
    assert expectation_for(F1, "bug", {"deepspeed": "0.19.2", "torch": "2.13.0+cpu"}).outcome == "REPRODUCED"
    assert expectation_for(F1, "bug", {"deepspeed": "0.19.8"}).outcome == "NOT_REPRODUCED"
    assert expectation_for(F1, "bug", {"deepspeed": "0.19.3"}).outcome == "NOT_REPRODUCED"  # the boundary
    assert expectation_for(F1, "bug", {"torch": "2.13.0"}) is None  # no deepspeed: no range holds
    assert expectation_for(F1, "fixed", {}).outcome == "PASS"


def _item(outcome: str, deepspeed: str) -> ItemRecord:
    launch = LaunchResult(
        command=["torchrun"],
        returncode=0,
        timed_out=False,
        wall_s=12.5,
        world_size=2,
        records={0: rec(0, [1.0, 0.2, 0.2], 100), 1: rec(1, [1.0, 0.3, 0.3], 200)},
        rank_tails={0: "tail0", 1: "tail1"},
    )
    e = env(deepspeed)
    return item_record(
        run_id="r",
        item=ItemId("c", "F1", "bug"),
        observation=Observation(Outcome(outcome)),
        env=e,
        expected=expectation_for(F1, "bug", e.packages),
        launch=launch,
        repro_cmd="python -m harness run",
        item_dir=Path("/tmp/i"),
        started_at="t0",
        finished_at="t1",
    )


def test_item_record_has_the_design_fields_and_the_match() -> None:
    record = _item("REPRODUCED", "0.19.2")
    written = record.as_json()
    assert DESIGN_FIELDS <= set(written)
    assert record.expected == "REPRODUCED" and record.matched is True
    assert record.versions["deepspeed"] == "0.19.2" and record.versions["python"] == "3.11.7"
    peak, step = record.figure("peak_mem"), record.figure("step_time")
    assert peak is not None and peak.value == 200
    assert step is not None and step.steps is not None and step.steps.median == 0.3
    assert written["peak_mem_bytes"] == 200 and written["step_time_s"]["median"] == 0.3
    assert [r.log_tail for r in record.ranks] == ["tail0", "tail1"]
    assert record.guards[0].id == "use-cache-off"
    json.dumps(written)


def test_an_unexpected_observation_does_not_match() -> None:
    assert _item("NOT_REPRODUCED", "0.19.2").matched is False
    assert _item("REPRODUCED", "0.19.8").matched is False


def record_line(n: int) -> dict:
    """A whole record as a results line holds it, told apart by ``n`` (a field a newer harness added)."""
    return {
        "schema_version": 1,
        "run_id": "r",
        "cell": f"c{n}",
        "repro": "F1",
        "mode": "bug",
        "outcome": "PASS",
        "signature": None,
        "expected": None,
        "matched": False,
        "versions": {},
        "world_size": 2,
        "device": None,
        "wall_s": 0.0,
        "error": None,
        "reasons": [],
        "guards": [],
        "env": None,
        "repro_cmd": "python -m harness run",
        "started_at": "t0",
        "finished_at": "t1",
        "n": n,
    }


def numbers(path: Path) -> list[int]:
    return [r.as_json()["n"] for r in read_results(path)]


def test_results_file_keeps_whole_lines_and_ignores_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    with ResultsWriter(path) as writer:
        writer.append(parse_record(record_line(1)))
        writer.append(parse_record(record_line(2)))
    with open(path, "a") as fh:
        fh.write('{"schema_version": 1, "tor')
    assert numbers(path) == [1, 2]


def test_a_torn_last_line_is_set_aside_before_anything_is_appended(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    with ResultsWriter(path) as writer:
        writer.append(parse_record(record_line(1)))
    with open(path, "a") as fh:
        fh.write('{"schema_version": 1, "cell": "c", "tor')
    with ResultsWriter(path) as writer:
        assert writer.repaired == '{"schema_version": 1, "cell": "c", "tor'
        writer.append(parse_record(record_line(2)))
    # Without the repair the second record would have been glued onto the fragment and lost.
    assert numbers(path) == [1, 2]
    assert (tmp_path / "results.jsonl.torn").read_text().startswith('{"schema_version": 1, "cell": "c", "tor')


def test_lines_that_are_not_records_are_refused_with_the_line_number(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(record_line(1)) + "\n[1, 2]\n" + json.dumps(record_line(3)) + "\n")
    with pytest.raises(UserError, match="line 2: is a JSON list, not a record"):
        read_results(path)
    path.write_text(json.dumps({**record_line(1), "schema_version": 99}) + "\n")
    with pytest.raises(UserError, match="schema_version 99"):
        read_results(path)
    path.write_bytes(b"\xff\xfe binary\n" + json.dumps(record_line(2)).encode() + b"\n")
    with pytest.raises(UserError, match="line 1: is not UTF-8"):
        read_results(path)


def test_a_record_missing_its_identity_is_not_a_record() -> None:
    with pytest.raises(ValueError, match="has no cell"):
        parse_record({"schema_version": 1, "repro": "F1", "mode": "bug", "outcome": "PASS"})


def test_a_huge_error_message_is_capped_in_the_record_with_its_length_kept() -> None:
    from harness.records.item import MAX_MESSAGE_CHARS, error_summary

    summary = error_summary("ValueError", "x" * 10_000_000, 0)
    assert len(summary.message) == MAX_MESSAGE_CHARS and summary.full_message_chars == 10_000_000
    short = error_summary("ValueError", "short\nsecond line", 1)
    assert short.full_message_chars is None and "full_message_chars" not in short.model_dump(exclude_unset=True)
    assert error_summary("ValueError", "\n\nfirst real line\nmore", 1).message == "first real line"
