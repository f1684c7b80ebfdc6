"""Merging rank records into item records, and the results file."""

from __future__ import annotations

import json
from pathlib import Path

from harness.environments import Environment
from harness.expectations import expectation_for
from harness.launch import LaunchResult
from harness.metrics import peak_memory, step_time_summary
from harness.outcome import Observation
from harness.results import ItemId, ResultsWriter, item_record, read_results
from repros.f1_zero3_frozen_ckpt import SPEC as F1

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


def rec(rank: int, steps: list[float], peak: int) -> dict:
    return {
        "rank": rank,
        "status": "ok",
        "device": "cpu",
        "backend": "gloo",
        "step_times_s": steps,
        "warmup_steps": 1,
        "peak_mem_bytes": peak,
        "peak_mem_kind": "cpu_peak_rss",
        "guards": [{"id": "use-cache-off", "reason": ""}],
        "train": {"losses": [2.0, 1.0]},
    }


def test_step_time_takes_the_slowest_rank_per_step_after_warm_up() -> None:
    summary = step_time_summary([rec(0, [9.0, 0.1, 0.3, 0.2], 1), rec(1, [8.0, 0.2, 0.1, 0.4], 1)])
    # per-step maxima after warm-up: 0.2, 0.3, 0.4
    assert summary["n"] == 3
    assert abs(summary["median"] - 0.3) < 1e-9 and summary["min"] == 0.2 and summary["max"] == 0.4
    assert abs(summary["iqr"] - 0.1) < 1e-9


def test_no_steps_gives_no_step_time() -> None:
    assert step_time_summary([{"rank": 0, "step_times_s": [], "warmup_steps": 1}]) is None
    assert step_time_summary([{"rank": 0, "step_times_s": [0.5], "warmup_steps": 1}]) is None


def test_peak_memory_is_the_maximum_over_ranks() -> None:
    peak, kind, per_rank = peak_memory([rec(0, [], 100), rec(1, [], 300)])
    assert (peak, kind, per_rank) == (300, "cpu_peak_rss", {0: 100, 1: 300})


def test_expectations_follow_resolved_versions_including_local_labels() -> None:
    assert expectation_for(F1, "bug", {"deepspeed": "0.19.2", "torch": "2.13.0+cpu"}).outcome == "REPRODUCED"
    assert expectation_for(F1, "bug", {"deepspeed": "0.19.8"}).outcome == "NOT_REPRODUCED"
    assert expectation_for(F1, "bug", {"deepspeed": "0.19.3"}).outcome == "NOT_REPRODUCED"  # the boundary
    assert expectation_for(F1, "bug", {"torch": "2.13.0"}) is None  # no deepspeed: no range holds
    assert expectation_for(F1, "fixed", {}).outcome == "PASS"


def _item(outcome: str, deepspeed: str) -> dict:
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
        observation=Observation(outcome),
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
    assert DESIGN_FIELDS <= set(record)
    assert record["expected"] == "REPRODUCED" and record["matched"] is True
    assert record["versions"]["deepspeed"] == "0.19.2" and record["versions"]["python"] == "3.11.7"
    assert record["peak_mem_bytes"] == 200 and record["step_time_s"]["median"] == 0.3
    assert [r["log_tail"] for r in record["ranks"]] == ["tail0", "tail1"]
    assert record["guards"][0]["id"] == "use-cache-off"
    json.dumps(record)


def test_an_unexpected_observation_does_not_match() -> None:
    assert _item("NOT_REPRODUCED", "0.19.2")["matched"] is False
    assert _item("REPRODUCED", "0.19.8")["matched"] is False


def test_results_file_keeps_whole_lines_and_ignores_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    with ResultsWriter(path) as writer:
        writer.append({"a": 1})
        writer.append({"a": 2})
    with open(path, "a") as fh:
        fh.write('{"a": 3, "tor')
    assert read_results(path) == [{"a": 1}, {"a": 2}]
