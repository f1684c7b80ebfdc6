"""Exclusions that follow from a failure's own declaration are derived in planning, not written in the
matrix: a cell that pins its packages and runs every repro leaves out each failure that depends on a
package it does not install, saying which. The rows this replaced plan exactly what the derivation does,
in every lane, and what stays hand-written in ``matrix.yaml`` is few and each says why."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from harness.cli import options
from harness.core.errors import UserError
from harness.planning import items as planning
from harness.planning.items import plan_items
from tests.support.paths import REPO_ROOT

SHIPPED = REPO_ROOT / "matrix.yaml"
REPLACED = REPO_ROOT / "tests" / "support" / "derived_excludes_replaced.yaml"
LANES = ("ci", "nightly", "perf", "watch")


def _plan(matrix: Path, **values: object) -> tuple[list[str], list[str]]:
    plan = plan_items(options.selection({"matrix": matrix, **values}, cwd=REPO_ROOT))
    return (
        sorted(i.id.label() for i in plan.items),
        sorted(f"{e.cell}/{e.repro}/{e.mode}" for e in plan.excluded),
    )


@pytest.mark.parametrize("lane", LANES)
def test_the_derived_exclusions_plan_what_the_rows_they_replaced_planned(
    lane: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    derived = _plan(SHIPPED, lane=lane, family=["qwen2,llama"])
    data = yaml.safe_load(SHIPPED.read_text(encoding="utf-8"))
    replaced = yaml.safe_load(REPLACED.read_text(encoding="utf-8"))
    data["exclude"] += [
        {"cell": cell, "repro": repros, "reason": "written by hand, as before"} for cell, repros in replaced.items()
    ]
    by_hand = tmp_path / "matrix.yaml"
    by_hand.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    monkeypatch.setattr(planning, "package_exclusion", lambda cell, spec: None)
    assert _plan(by_hand, lane=lane, family=["qwen2,llama"]) == derived


def test_a_failure_is_left_out_of_a_cell_without_a_package_it_depends_on_saying_which() -> None:
    plan = plan_items(options.selection({"matrix": SHIPPED, "cells": ["torch-2.0-tf4.40", "current"]}, cwd=REPO_ROOT))
    reasons = {(e.cell, e.repro): e.reason for e in plan.excluded}
    assert reasons[("torch-2.0-tf4.40", "F1")] == "no deepspeed in this cell: F1 depends on it"
    assert reasons[("torch-2.0-tf4.40", "F3")] == "no deepspeed, bitsandbytes in this cell: F3 depends on them"
    assert reasons[("current", "F18")] == "no trl, kernels in this cell: F18 depends on them"
    planned = {(i.cell.name, i.repro_id) for i in plan.items}
    # F8 depends on torch alone: torch 2.0's cell runs it; current runs what it installs.
    assert ("torch-2.0-tf4.40", "F8") in planned and ("current", "F1") in planned


def test_a_cell_naming_its_repros_or_floating_runs_them_without_the_package() -> None:
    # current-cuda-only names F25 (trl, liger-kernel: not installed): its INFRA item is what it shows on a CPU;
    # latest floats, and runs every failure its newest releases can.
    plan = plan_items(options.selection({"matrix": SHIPPED, "cells": ["current-cuda-only", "latest"]}, cwd=REPO_ROOT))
    planned = {(i.cell.name, i.repro_id) for i in plan.items}
    assert ("current-cuda-only", "F25") in planned and ("latest", "F31") in planned


def test_the_shipped_matrix_writes_few_exclusions_each_with_its_reason() -> None:
    rows = yaml.safe_load(SHIPPED.read_text(encoding="utf-8"))["exclude"]
    assert len(rows) <= 60
    assert all(isinstance(r["reason"], str) and r["reason"].strip() and "\n" not in r["reason"] for r in rows)


def test_an_exclusion_names_cells_in_a_list_and_an_unknown_one_is_refused(tmp_path: Path) -> None:
    data = yaml.safe_load(SHIPPED.read_text(encoding="utf-8"))
    data["exclude"] = [{"cell": ["current", "tf4"], "repro": ["F1", "F2"], "reason": "both, both"}]
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    plan = plan_items(options.selection({"matrix": matrix, "cells": ["current", "tf4"]}, cwd=REPO_ROOT))
    assert {(e.cell, e.repro) for e in plan.excluded if e.reason == "both, both"} == {
        ("current", "F1"),
        ("current", "F2"),
        ("tf4", "F1"),
        ("tf4", "F2"),
    }
    data["exclude"] = [{"cell": ["current", "tf9"], "repro": "F1", "reason": "typo"}]
    matrix.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    with pytest.raises(UserError) as caught:
        plan_items(options.selection({"matrix": matrix}, cwd=REPO_ROOT))
    assert "exclude[0].cell[1]" in str(caught.value) and "tf9" in str(caught.value)
