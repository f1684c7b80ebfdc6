"""The config grid: its combinations, as data, planned and classified."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Any

import pytest

from harness.analysis.compare import NEW_REGRESSION, compare_runs
from harness.config.grid import load_grid
from harness.config.matrix import Cell
from harness.core.errors import UserError
from harness.planning.grid import AS_WRITTEN, GUARDED, combinations, planned, restrict
from harness.records.item import ItemRecord, parse_record
from harness.workflows.grid import annotate, guarded_follow_up
from repros.trainer.grid_axes import AXES, scenario_overrides

PATH = Path("m.yaml")
RAW = {
    "axes": {
        "engine": ["deepspeed-zero2", "deepspeed-zero3", "ddp"],
        "adapter": ["lora", "dora", "dschat-lora"],
        "checkpointing": ["off", "non-reentrant", "default"],
        "dtype": ["bf16", "fp32"],
    },
    "coverage": {"ci": "pairwise", "nightly": "product"},
    "include": [{"engine": "deepspeed-zero3", "adapter": "lora", "checkpointing": "non-reentrant", "dtype": "bf16"}],
    "exclude": [{"engine": "ddp", "adapter": "dschat-lora", "reason": "not here"}],
    "expect": [
        {
            "combination": {"engine": "deepspeed-zero3", "checkpointing": "non-reentrant"},
            "versions": {"deepspeed": "<0.19.3"},
            "outcome": "REPRODUCED",
            "signature": "F1.recompute-shape-0",
            "established_by": "python -m harness grid ...",
        },
    ],
}


def item(**fields: Any) -> ItemRecord:
    """A grid item's record: ``fields`` over what every record holds."""
    return parse_record(
        {
            "schema_version": 1,
            "run_id": "RUN",
            "cell": "c",
            "repro": "deepspeed-zero3+lora",
            "mode": AS_WRITTEN,
            "outcome": "PASS",
            "signature": None,
            "expected": None,
            "matched": False,
            "versions": {},
            "world_size": 2,
            "device": "cpu",
            "wall_s": 1.0,
            "error": None,
            "reasons": [],
            "guards": [],
            "env": None,
            "repro_cmd": "ft-regress grid ...",
            "started_at": "2026-01-01T00:00:00Z",
            "finished_at": "2026-01-01T00:00:01Z",
            **fields,
        }
    )


def grid():
    found = load_grid(PATH, RAW, ["ci", "nightly"])
    assert found is not None
    return found


def test_pairwise_covers_every_pair_of_values_once_at_least_and_keeps_the_documented_ones() -> None:
    g = grid()
    combos = combinations(g, "pairwise", restrict(g, []))
    assert combos[0] == RAW["include"][0]
    assert not any(c["engine"] == "ddp" and c["adapter"] == "dschat-lora" for c in combos)
    for a, b in itertools.combinations(g.axes, 2):
        for va, vb in itertools.product(g.axes[a], g.axes[b]):
            if {a: va, b: vb} == {"engine": "ddp", "adapter": "dschat-lora"}:
                continue
            assert any(c[a] == va and c[b] == vb for c in combos), (a, va, b, vb)
    product = combinations(g, "product", restrict(g, []))
    assert len(product) == 3 * 3 * 3 * 2 - 3 * 2 and len(combos) < len(product) / 2


def test_only_restricts_an_axis_and_refuses_what_is_not_there() -> None:
    g = grid()
    combos = combinations(g, "product", restrict(g, ["engine=ddp", "dtype=fp32"]))
    assert {c["engine"] for c in combos} == {"ddp"} and {c["dtype"] for c in combos} == {"fp32"}
    with pytest.raises(UserError, match="unknown value 'fsdp9'"):
        restrict(g, ["engine=fsdp9"])
    with pytest.raises(UserError, match="no axis"):
        restrict(g, ["colour=red"])


def test_a_bad_grid_section_names_the_field() -> None:
    with pytest.raises(UserError) as info:
        load_grid(PATH, {**RAW, "axes": {"engine": ["deepspeed-zero4"]}}, ["ci"])
    assert info.value.field == "grid.axes.engine" and "deepspeed-zero3" in info.value.fix
    with pytest.raises(UserError) as info:
        load_grid(PATH, {**RAW, "exclude": [{"engine": "ddp"}]}, ["ci", "nightly"])
    assert info.value.field == "grid.exclude[0]" and "reason" in info.value.fix
    with pytest.raises(UserError) as info:
        load_grid(PATH, {**RAW, "expect": [{"outcome": "GREAT"}]}, ["ci", "nightly"])
    assert info.value.field == "grid.expect[0].outcome"


def test_every_axis_value_is_a_scenario_the_trainer_accepts() -> None:
    from repros.trainer.scenario import Scenario

    for axis, values in AXES.items():
        for value in values:
            Scenario(**scenario_overrides({axis: value}))


def test_an_expectation_rule_sets_the_records_expected_outcome_by_combination_and_versions() -> None:
    g = grid()
    f1 = {"engine": "deepspeed-zero3", "adapter": "lora", "checkpointing": "non-reentrant", "dtype": "bf16"}
    record = item(
        mode=AS_WRITTEN,
        scenario=f1,
        outcome="REPRODUCED",
        signature="F1.recompute-shape-0",
        versions={"deepspeed": "0.19.2"},
        matched=False,
        expected=None,
    )
    annotated = annotate(g, record)
    assert annotated.expected == "REPRODUCED" and annotated.matched is True
    newer = annotate(
        g, annotated.evolve(versions={"deepspeed": "0.19.8"}, outcome="PASS", expected=None, matched=False)
    )
    assert newer.expected is None and newer.matched is False  # no rule: reported, not failed
    assert newer.explored is True and not newer.counts_against  # no JUnit failure, no exit 1
    missed = annotate(g, annotated.evolve(outcome="PASS", matched=False, expected=None))
    assert missed.expected == "REPRODUCED" and missed.counts_against  # a rule that did not hold fails


def test_a_known_failure_is_run_again_through_the_guards() -> None:
    cell = Cell(
        name="c",
        packages={"torch": "==2.13.0"},
        lanes=("ci",),
        world_size=2,
        python="3.11",
        timeout_s=60.0,
        exclude_newer=None,
        provider="uv",
        repros=None,
    )
    (planned_item,) = planned([cell], [RAW["include"][0]])
    assert guarded_follow_up(planned_item, item(outcome="PASS")) == []
    (again,) = guarded_follow_up(planned_item, item(outcome="REPRODUCED", signature="F1.recompute-shape-0"))
    assert again.mode == GUARDED and again.rank_mode == "fixed"
    assert again.scenario == planned_item.scenario and again.variant == planned_item.variant


def test_a_combination_that_trained_and_now_fails_is_a_regression_in_compare() -> None:
    base = {
        "cell": "c",
        "repro": "deepspeed-zero3+lora",
        "mode": AS_WRITTEN,
        "scenario": {"engine": "deepspeed-zero3"},
        "matched": False,
        "expected": None,
    }
    changes = compare_runs([item(**base, outcome="PASS")], [item(**base, outcome="NEW_FAILURE")])
    assert [c.kind for c in changes] == [NEW_REGRESSION]


TRACEBACK = """Traceback (most recent call last):
  File "/w/repros/runtime/rank_main.py", line 160, in main
    repro.run(ctx)
  File "/env/site-packages/torch/distributed/tensor/_dispatch.py", line 412, in _try_replicate_spec_for_scalar_tensor
    raise RuntimeError(
RuntimeError: aten.copy_.default got mixed torch.Tensor and DTensor
"""


def test_a_new_failure_keeps_its_traceback_and_the_grid_says_where_it_was_raised() -> None:
    import io

    from rich.console import Console

    from harness.execution.classify import classify
    from harness.records.item import error_summary
    from harness.reports.grid_tables import print_grid
    from harness.reports.junit import _case
    from tests.support.rank_records import error_record, failed_launch

    rank = error_record(1, "RuntimeError", "aten.copy_.default got mixed torch.Tensor and DTensor")
    assert rank.error is not None
    rank = rank.evolve(error=dataclasses.replace(rank.error, traceback=TRACEBACK))
    observed = classify("scenario", None, failed_launch({0: None, 1: rank}, {0: -15, 1: 1}), [])
    assert observed.outcome == "NEW_FAILURE" and observed.error is not None
    error = error_summary(observed.error.type, observed.error.message, observed.error.rank, observed.error.traceback)
    assert error.traceback is not None
    assert error.traceback.endswith("got mixed torch.Tensor and DTensor\n") and error.rank == 1
    record = item(
        cell="c",
        repro="fsdp2+lora",
        mode=AS_WRITTEN,
        outcome="NEW_FAILURE",
        scenario={"engine": "fsdp2"},
        error=error.model_dump(),
        matched=False,
        expected=None,
        wall_s=1.0,
        signature=None,
        reasons=[],
        repro_cmd="ft-regress grid ...",
    )
    out = io.StringIO()
    print_grid(Console(file=out, width=200), [record])
    assert "raised at /env/site-packages/torch/distributed/tensor/_dispatch.py:412" in out.getvalue()
    assert "_dispatch.py" in (_case(record).result[0].text or "")


def test_a_rule_may_name_a_repro_and_then_any_of_its_signatures_matches() -> None:
    raw = {
        **RAW,
        "expect": [
            {
                "combination": {"checkpointing": "default"},
                "versions": {"transformers": "<5"},
                "outcome": "REPRODUCED",
                "signature": "F5",
                "established_by": "grid ...",
            }
        ],
    }
    g = load_grid(PATH, raw, ["ci", "nightly"])
    assert g is not None
    base = item(
        mode=AS_WRITTEN,
        scenario={"checkpointing": "default"},
        outcome="REPRODUCED",
        versions={"transformers": "4.57.6"},
        matched=False,
        expected=None,
    )
    for signature, matched in (
        ("F5.no-grad-fn", True),
        ("F5.deepspeed-loss-assert", True),
        ("F1.recompute-shape-0", False),
        ("F50.other", False),
        (None, False),
    ):
        record = annotate(g, base.evolve(signature=signature))
        assert record.matched is matched, signature


def test_a_rule_may_hold_on_one_device_kind_only() -> None:
    cpu_only = {
        "combination": {"adapter": "qlora-8bit"},
        "versions": {"transformers": "<4.44"},
        "device": "cpu",
        "outcome": "INFRA",
        "established_by": "grid ...",
    }
    raw = {
        **RAW,
        "expect": [
            cpu_only,
            {
                "combination": {"adapter": "qlora-8bit"},
                "outcome": "REPRODUCED",
                "signature": "F3",
                "established_by": "grid ...",
            },
        ],
    }
    g = load_grid(PATH, raw, ["ci", "nightly"])
    assert g is not None
    base = item(
        mode=AS_WRITTEN,
        scenario={"adapter": "qlora-8bit"},
        outcome="INFRA",
        signature=None,
        versions={"transformers": "4.43.0"},
        matched=False,
        expected=None,
    )
    on_cpu = annotate(g, base.evolve(device="cpu"))
    assert on_cpu.expected == "INFRA" and on_cpu.matched and on_cpu.expected_device == "cpu"
    on_gpu = annotate(g, base.evolve(device="cuda"))
    assert on_gpu.expected == "REPRODUCED" and not on_gpu.matched  # a GPU runner reads the next rule
    with pytest.raises(UserError) as info:
        load_grid(PATH, {**RAW, "expect": [{**cpu_only, "device": "tpu"}]}, ["ci", "nightly"])
    assert info.value.field == "grid.expect[0].device" and "cuda" in info.value.fix


def test_a_rule_may_hold_in_some_model_families_only() -> None:
    in_llava = {
        "combination": {"engine": "ddp"},
        "family": "llava",
        "outcome": "REPRODUCED",
        "signature": "F23",
        "established_by": "grid ... --only family=llava",
    }
    raw = {
        **RAW,
        "expect": [
            in_llava,
            {"combination": {"engine": "ddp"}, "outcome": "REPRODUCED", "signature": "F4", "established_by": "grid"},
        ],
    }
    g = load_grid(PATH, raw, ["ci", "nightly"])
    assert g is not None
    base = item(mode=AS_WRITTEN, scenario={"engine": "ddp"}, outcome="REPRODUCED", signature="F23.unused-vision")
    llava = annotate(g, base.evolve(family="llava", cell="c@llava"))
    assert llava.expected == "REPRODUCED" and llava.matched and (llava.expected_when or {})["family"] == "llava"
    qwen2 = annotate(g, base)  # no family in the record: the default family, which reads the next rule
    assert qwen2.expected == "REPRODUCED" and not qwen2.matched
    for bad, message in (("gpt2", "unknown model family 'gpt2'"), ([], "names no family")):
        with pytest.raises(UserError) as info:
            load_grid(PATH, {**RAW, "expect": [{**in_llava, "family": bad}]}, ["ci", "nightly"])
        assert info.value.field == "grid.expect[0].family" and message in str(info.value)
