"""Strategy names, the tolerances they are held to, and which strategies a lane plans in which cell."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from harness.config.crosscheck import DEFAULT_AXES
from harness.config.matrix import Matrix, load_matrix
from harness.config.repros import discover
from harness.core.errors import UserError
from harness.planning.crosscheck import pairwise, planned, select, space
from repros.runtime.spec import MODES
from repros.trainer.crosscheck.strategy import AXES, Strategy, UnknownStrategy, from_axes, parse, valid
from repros.trainer.crosscheck.tolerance import KAPPA, Tolerance
from tests.support.paths import REPO_ROOT


def load_shipped_matrix(path: Path = REPO_ROOT / "matrix.yaml") -> Matrix:
    return load_matrix(path, known_repros=discover().repros.keys(), known_modes=MODES)


axis_values = st.fixed_dictionaries({axis: st.sampled_from(values) for axis, values in AXES.items()})


@given(axis_values)
def test_every_strategy_is_named_once_and_read_back_from_its_name(values: dict[str, str]) -> None:
    if not valid(values):
        with pytest.raises(UnknownStrategy):
            from_axes(values)
        return
    strategy = from_axes(values)
    assert parse(strategy.name) == strategy
    assert strategy.parts()["engine"] in ("single", "ddp", "deepspeed", "fsdp1", "fsdp2")


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("zero5-fp32", "ZeRO stage"),
        ("ddp-fp16", "precision"),
        ("ddp", "<engine>-<precision>"),
        ("single-fp32-accum-engine", "no engine to accumulate"),
        ("ddp-fp32-dora-ckpt-nr", "out of order"),
        ("ddp-fp32-turbo", "not a part"),
    ],
)
def test_a_name_that_is_no_strategy_is_refused_saying_why(name: str, why: str) -> None:
    with pytest.raises(UnknownStrategy, match=why):
        parse(name)


def test_pairwise_puts_every_pair_of_two_parts_values_into_some_strategy() -> None:
    chosen = pairwise(DEFAULT_AXES)
    valid_pairs = set()
    for strategy in space(DEFAULT_AXES):
        parts = _axis_values(strategy)
        valid_pairs |= {(a, parts[a], b, parts[b]) for a, b in itertools.combinations(parts, 2)}
    covered = set()
    for strategy in chosen:
        parts = _axis_values(strategy)
        covered |= {(a, parts[a], b, parts[b]) for a, b in itertools.combinations(parts, 2)}
    assert valid_pairs <= covered
    assert len(chosen) < len(space(DEFAULT_AXES)) / 5  # a cover, not the product
    assert pairwise(DEFAULT_AXES) == chosen  # the same every time


def _axis_values(strategy: Strategy) -> dict[str, str]:
    return {
        "engine": strategy.engine_token,
        "precision": strategy.precision,
        "checkpointing": strategy.checkpointing,
        "accumulation": strategy.accumulation,
        "adapter": strategy.adapter,
        "optimizer": strategy.optimizer,
    }


def test_tolerances_grow_with_the_step_and_the_precision_and_a_count_must_be_equal() -> None:
    fp32 = Tolerance("fp32", tokens=60, width=128)
    bf16 = Tolerance("bf16-autocast", tokens=60, width=128)
    for quantity in KAPPA:
        if quantity == "initial_weight":
            continue
        assert fp32.of(quantity, 1) > fp32.of(quantity, 0) > 0
        assert bf16.of(quantity, 0) > 100 * fp32.of(quantity, 0)
    assert fp32.of("optimizer_steps", 3) == 0
    # A gradient halved (relative difference 0.5) is far outside even bf16's tolerance at the last step.
    assert bf16.of("grad_norm", 3) < 0.5 and bf16.of("gradient", 3) < 0.5


def test_an_adaptive_optimizer_and_a_weight_stored_coarsely_widen_the_weights_tolerance_only() -> None:
    sgd = Tolerance("fp32", tokens=60, width=128)
    adam = Tolerance("fp32", tokens=60, width=128, adaptive=True)
    assert adam.of("weight", 1) > sgd.of("weight", 1)
    assert adam.of("gradient", 0) == sgd.of("gradient", 0)  # the first step's gradients come before any step
    assert adam.of("gradient", 1) > sgd.of("gradient", 1)
    assert sgd.of("weight", 1, stored_ratio=1000) > sgd.of("weight", 1)
    assert sgd.of("weight", 1, stored_ratio=1000, stored="bf16") > sgd.of("weight", 1, stored_ratio=1000)


def test_the_shipped_ci_lane_holds_every_engine_in_both_precisions_in_the_current_cell() -> None:
    matrix = load_shipped_matrix()
    strategies = select(matrix.crosscheck, "ci")
    assert len(strategies) >= 12
    assert {s.engine_token for s in strategies} == set(AXES["engine"])
    assert {s.precision for s in strategies} == {"fp32", "bf16"}
    assert {s.checkpointing for s in strategies} == set(AXES["checkpointing"])
    assert {s.accumulation for s in strategies} == set(AXES["accumulation"])
    assert matrix.crosscheck.runs_in("ci", "current") and not matrix.crosscheck.runs_in("ci", "tf4")


def test_a_cell_without_deepspeed_or_bitsandbytes_excludes_what_needs_them_saying_so() -> None:
    matrix = load_shipped_matrix()
    cell = matrix.cells["current"]
    bare = type(cell)(**{**cell.__dict__, "name": "bare", "packages": {**cell.packages, "deepspeed": None}})
    items, excluded = planned([bare], [parse("zero3-fp32"), parse("ddp-fp32"), parse("ddp-fp32-adamw8bit")], {})
    assert [i.strategy for i in items] == ["ddp-fp32", "ddp-fp32-adamw8bit"]
    assert [(e.mode, e.reason) for e in excluded] == [("zero3-fp32", "the cell has no deepspeed (ZeRO-3 needs it)")]


def test_a_single_process_strategy_runs_on_one_rank_and_the_others_on_the_cells() -> None:
    cell = load_shipped_matrix().cells["current"]
    items, _ = planned([cell], [parse("single-fp32"), parse("fsdp2-bf16")], {"seed": 3, "steps": 2})
    assert [i.world_size for i in items] == [1, cell.world_size]
    assert items[0].launch_params()["strategy"] == "single-fp32"
    assert items[0].launch_params()["seed"] == 3


def test_strategies_named_or_patterned_on_the_command_line_or_refused_with_the_fix() -> None:
    matrix = load_shipped_matrix()
    named = select(matrix.crosscheck, None, ["zero3-bf16-ckpt-nr", "zero*-fp32"])
    assert named[0].name == "zero3-bf16-ckpt-nr"
    assert {s.name for s in named[1:]} == {"zero0-fp32", "zero1-fp32", "zero2-fp32", "zero3-fp32"}
    with pytest.raises(UserError, match="matches no strategy"):
        select(matrix.crosscheck, None, ["zero9*"])
    with pytest.raises(UserError, match="stage"):
        select(matrix.crosscheck, None, ["zero9-fp32"])


def test_a_matrix_section_naming_an_unknown_lane_cell_or_strategy_is_refused_naming_the_field(tmp_path: Path) -> None:
    shipped = yaml.safe_load(Path(load_shipped_matrix().path).read_text())
    for section, field in (
        ({"lanes": {"weekly": "pairwise"}}, "crosscheck.lanes.weekly"),
        ({"lanes": {"ci": {"strategies": ["ddp-fp32"], "cells": ["nowhere"]}}}, "crosscheck.lanes.ci.cells"),
        ({"lanes": {"ci": ["ddp-fp42"]}}, "crosscheck.lanes.ci"),
        ({"axes": {"engine": ["zero7"]}}, "crosscheck.axes.engine"),
    ):
        path = tmp_path / "matrix.yaml"
        path.write_text(yaml.safe_dump({**shipped, "crosscheck": section}))
        with pytest.raises(UserError) as caught:
            load_shipped_matrix(path)
        assert field in str(caught.value)
