"""A failure says the world sizes it can occur at: outside them its items are excluded with the reason
(never a NOT_REPRODUCED against an expected REPRODUCED), and an expectation may be bounded by them."""

from __future__ import annotations

from typing import Any

import pytest

from harness.cli import options
from harness.config.expectations import expectation_for
from harness.planning.items import plan_items
from repros.runtime.outcomes import Outcome
from repros.runtime.spec import Expectation, ReproSpec, Signature, WorldSizes, spec_from_data, spec_to_data
from tests.support.paths import REPO_ROOT


def _spec(**more: Any) -> ReproSpec:
    fields: dict[str, Any] = {
        "id": "X1",
        "title": "t",
        "upstream": (),
        "signatures": (Signature("X1.s", "ValueError", "boom"),),
        "expectations": (Expectation("bug", Outcome.REPRODUCED),),
    }
    fields.update(more)
    return ReproSpec(**fields)


@pytest.mark.parametrize("text", ["any", ">=2", "==1", "2..8"])
def test_world_sizes_read_back_what_they_print(text: str) -> None:
    assert str(WorldSizes.parse(text)) == text


def test_world_sizes_hold_what_they_say() -> None:
    assert 1 not in WorldSizes(2) and 2 in WorldSizes(2) and 1024 in WorldSizes(2)
    assert 3 not in WorldSizes(1, 2) and 1 in WorldSizes(1, 2)
    with pytest.raises(ValueError, match="below the minimum"):
        WorldSizes(4, 2)
    with pytest.raises(ValueError, match="whole number"):
        WorldSizes(0)


def test_a_bounded_failure_must_say_why() -> None:
    with pytest.raises(ValueError, match="world_sizes_why"):
        _spec(world_sizes=WorldSizes(2))
    spec = _spec(world_sizes=WorldSizes(2), world_sizes_why="one rank gathers nothing")
    assert spec.world_size_exclusion(2) is None
    assert spec.world_size_exclusion(1) == "X1 cannot occur at world size 1 (only >=2): one rank gathers nothing"


def test_a_repro_fixing_its_world_size_outside_its_own_bounds_is_refused() -> None:
    with pytest.raises(ValueError, match="outside its world_sizes"):
        _spec(world_size=1, world_sizes=WorldSizes(2), world_sizes_why="w")


def test_the_bounds_survive_the_trip_through_data() -> None:
    spec = _spec(
        world_sizes=WorldSizes(2),
        world_sizes_why="why",
        expectations=(Expectation("bug", Outcome.REPRODUCED, world_sizes=WorldSizes(1, 1)),),
    )
    back = spec_from_data(spec_to_data(spec))
    assert back.world_sizes == WorldSizes(2) and back.world_sizes_why == "why"
    assert back.expectations[0].world_sizes == WorldSizes(1, 1)


def test_an_expectation_bounded_by_world_size_holds_only_there() -> None:
    spec = _spec(
        expectations=(
            Expectation("bug", Outcome.NOT_REPRODUCED, world_sizes=WorldSizes(1, 1)),
            Expectation("bug", Outcome.REPRODUCED),
        )
    )
    assert expectation_for(spec, "bug", {}, "cpu", 1).outcome == Outcome.NOT_REPRODUCED
    assert expectation_for(spec, "bug", {}, "cpu", 2).outcome == Outcome.REPRODUCED


def test_at_world_size_1_the_failures_that_need_two_ranks_are_excluded_saying_why(tmp_path) -> None:
    opts = options.selection(
        {"matrix": REPO_ROOT / "matrix.yaml", "cells": ["ds-0.19.2"], "world_size": 1, "cache_dir": tmp_path}
    )
    plan = plan_items(opts)
    excluded = {(e.repro, e.mode): e.reason for e in plan.excluded}
    planned = {(i.repro_id, i.mode) for i in plan.items}
    for repro in ("F12", "F17", "F22"):
        assert (repro, "bug") not in planned and (repro, "fixed") not in planned
        assert "cannot occur at world size 1" in excluded[(repro, "bug")]
        assert "num_partitions == 1" in excluded[(repro, "bug")]
    assert ("F1", "bug") in planned and all(i.world_size == 1 for i in plan.items)
    # The rerun command of each item carries the world size that chose it.
    from harness.planning.commands import repro_command

    f1 = next(i for i in plan.items if i.repro_id == "F1")
    assert "--world-size 1" in repro_command(opts, f1)
