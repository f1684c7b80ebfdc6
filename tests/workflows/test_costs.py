"""costs: each repro's variants planned in each cell, priced against the documented scenario."""

from __future__ import annotations

from harness.cli.options import selection
from harness.config.repros import discover
from harness.records.item import ItemRecord, parse_record
from harness.reports.cost_table import entries
from harness.workflows.costs import plan_costs
from tests.support.paths import REPO_ROOT

MIB = 2**20


def test_every_variant_of_every_repro_is_planned_per_cell_with_the_mode_its_ranks_run() -> None:
    opts = selection(
        {"matrix": REPO_ROOT / "matrix.yaml", "cells": ["current"], "repros": ["F1", "F4"], "model": "small"}
    )
    plan = plan_costs(opts)
    labels = [(i.repro_id, i.mode, i.rank_mode, i.cell.model) for i in plan.items]
    assert ("F1", "as-documented", "bug", "small") in labels and ("F1", "fixed-trainer", "fixed", "small") in labels
    assert ("F1", "zero2", "bug", "small") in labels and ("F4", "fixed-trainer", "fixed", "small") in labels
    assert all(i.runs_as_written and i.variant == i.mode for i in plan.items)


def record(variant: str, outcome: str, mem: int, cpu: float, cell: str = "c") -> ItemRecord:
    step = {"median": cpu, "iqr": cpu * 0.02, "min": cpu, "max": cpu, "n": 8}
    return parse_record(
        {
            "schema_version": 1,
            "run_id": "RUN",
            "cell": cell,
            "repro": "F1",
            "mode": variant,
            "variant": variant,
            "outcome": outcome,
            "train_peak_mem_bytes": mem,
            "train_peak_mem_kind": "cpu_rss_hwm_above_baseline",
            "step_cpu_time_s": step,
            "step_time_s": step,
            "model": "small",
            "signature": None,
            "expected": None,
            "matched": True,
            "explored": True,
            "versions": {},
            "world_size": 2,
            "device": "cpu",
            "wall_s": 1.0,
            "error": None,
            "reasons": [],
            "guards": [],
            "env": None,
            "repro_cmd": "python -m harness costs",
            "started_at": "2026-01-01T00:00:00Z",
            "finished_at": "2026-01-01T00:00:01Z",
        }
    )


def test_a_variant_is_priced_against_the_documented_scenario_where_that_trains() -> None:
    specs = {k: r.spec for k, r in discover().repros.items()}
    rounds = [
        [
            record("as-documented", "PASS", 300 * MIB, 2.0),
            record("no-checkpointing", "PASS", 360 * MIB, 1.4),
            record("as-documented", "REPRODUCED", 100 * MIB, 1.0, cell="old"),
            record("zero2", "PASS", 280 * MIB, 1.1, cell="old"),
        ]
    ]
    found = {(e.variant, e.cell): e for e in entries(rounds, specs)}
    priced = found[("no-checkpointing", "c")].against_documented
    assert priced is not None
    assert abs(priced.train_peak_mem_ratio - 1.2) < 1e-9 and abs(priced.step_cpu_time_s_ratio - 0.7) < 1e-9
    zero2 = found[("zero2", "old")]
    assert zero2.against_documented is not None and "ended REPRODUCED" in zero2.against_documented.why_not
    assert zero2.claim  # where the field recommends it


def test_rounds_give_the_median_and_the_run_to_run_spread() -> None:
    rounds = [[record("as-documented", "PASS", 300 * MIB, 2.0)], [record("as-documented", "PASS", 306 * MIB, 2.1)]]
    (entry,) = entries(rounds, {})
    assert entry.rounds == 2 and entry.step_cpu_time_s == 2.05
    assert abs(entry.spread.step_cpu_time - 0.1 / 2.05) < 1e-9


def test_an_interrupted_costs_run_keeps_what_ran_says_it_is_partial_and_starts_no_further_round(
    tmp_path, monkeypatch
) -> None:
    import json

    from harness.cli import main as cli
    from harness.records.run_dir import RunDir
    from harness.records.run_meta import RunMeta
    from harness.workflows import costs as costs_module

    started: list[str] = []

    class Interrupted:
        """A round that ran one item, then met Ctrl-C."""

        def __init__(self, opts, *args, **kwargs) -> None:
            self.out = opts.out_dir

        def execute(self) -> int:
            started.append(str(self.out))
            run = RunDir.create(self.out)
            run.write_meta(RunMeta(interrupted="SIGINT"))
            run.results_path.write_text(json.dumps(record("as-documented", "PASS", 300 * MIB, 2.0).as_json()) + "\n")
            return 130

    monkeypatch.setattr(costs_module, "RunSession", Interrupted)
    out = tmp_path / "costs"
    status = cli.main(
        [
            "costs",
            "--matrix",
            str(REPO_ROOT / "matrix.yaml"),
            "--cells",
            "current",
            "--repros",
            "F1",
            "--rounds",
            "3",
            "--out",
            str(out),
        ]
    )
    assert status == 130 and len(started) == 1
    written = json.loads((out / "costs.json").read_text())
    assert written["interrupted"] == "SIGINT" and written["rounds"] == 1 and written["ran_items"] == 1
    assert written["planned_items"] > written["ran_items"]


def test_where_the_documented_scenario_fails_the_workarounds_that_train_are_priced_against_the_fixed_trainer() -> None:
    rounds = [
        [
            record("as-documented", "REPRODUCED", 100 * MIB, 1.0, cell="old"),
            record("fixed-trainer", "PASS", 200 * MIB, 2.0, cell="old"),
            record("zero2", "PASS", 50 * MIB, 1.5, cell="old"),
            record("small-sub-group", "REPRODUCED", 90 * MIB, 1.0, cell="old"),
        ]
    ]
    found = {e.variant: e for e in entries(rounds, {})}
    priced = found["zero2"].against_fixed_trainer
    assert priced is not None
    assert abs(priced.train_peak_mem_ratio - 0.25) < 1e-9 and abs(priced.step_cpu_time_s_ratio - 0.75) < 1e-9
    assert found["small-sub-group"].against_fixed_trainer is None  # it does not train: nothing to price
    assert found["fixed-trainer"].against_fixed_trainer is None
