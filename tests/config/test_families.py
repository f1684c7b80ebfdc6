"""Model families on the orchestrator's side: ``--family`` runs each selected cell in each family (a cell
in another family than its own is ``<cell>@<family>``, keeping the cell's exclusions), a family the cell's
transformers predates or a failure the family cannot have is excluded with the reason, every item tells
its ranks the family, its record says it, and its rerun command brings it back. ``grid --only family=F``
does the same for the grid. A name that is not a family is one line and exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.cli import options
from harness.core.errors import UserError
from harness.planning.commands import repro_command
from harness.planning.items import plan_items
from harness.workflows.grid import family_restriction
from repros.runtime.families import DEFAULT_FAMILY, FAMILIES, current_family, use_family
from tests.support.paths import REPO_ROOT

SHIPPED = REPO_ROOT / "matrix.yaml"


def selection(**values: object) -> options.RunOptions:
    return options.selection({"matrix": SHIPPED, **values}, cwd=REPO_ROOT)


def test_the_matrix_schema_names_exactly_the_families_the_ranks_can_build() -> None:
    schema = json.loads((REPO_ROOT / "harness" / "config" / "matrix.schema.json").read_text())
    assert schema["$defs"]["settings"]["properties"]["family"]["enum"] == list(FAMILIES)


def test_every_family_is_built_from_a_release_a_cell_can_pin() -> None:
    from packaging.version import Version

    for family in FAMILIES.values():
        assert Version(family.min_transformers) >= Version("4.28.0"), family.name
        assert family.model_class and family.traits
    assert DEFAULT_FAMILY in FAMILIES
    with pytest.raises(ValueError, match="unknown model family 'gpt2'; known: qwen2, llama"):
        use_family("gpt2")
    assert current_family().name == DEFAULT_FAMILY


def test_without_family_nothing_changes_and_items_say_their_cells_family() -> None:
    plan = plan_items(selection(cells=["current"], repros=["F1"]))
    assert [i.cell.name for i in plan.items] == ["current", "current"]
    assert {i.launch_params()["family"] for i in plan.items} == {DEFAULT_FAMILY}


def test_family_runs_each_cell_in_each_family_named_and_keeps_the_cells_exclusions() -> None:
    plan = plan_items(selection(cells=["current", "ds-0.19.2"], repros=["F1", "F15"], family=["qwen2,llama"]))
    names = {(i.cell.name, i.repro_id) for i in plan.items}
    assert {("current", "F1"), ("current@llama", "F1"), ("ds-0.19.2@llama", "F1")} <= names
    # ds-0.19.2 excludes F15 (it differs from current only in deepspeed): so does its llama variant.
    assert ("ds-0.19.2@llama", "F15") not in names
    excluded = {(e.cell, e.repro): e.reason for e in plan.excluded}
    assert "deepspeed" in excluded[("ds-0.19.2@llama", "F15")]
    llama = next(i for i in plan.items if i.cell.name == "current@llama")
    assert llama.launch_params()["family"] == "llama" and llama.cell.family_of == "current"


def test_a_family_a_cells_transformers_predates_is_excluded_with_the_release() -> None:
    plan = plan_items(selection(cells=["torch-2.0-tf4.40"], repros=["F6"], family=["gemma2"]))
    assert plan.items == []
    (excluded,) = {e.reason for e in plan.excluded}
    assert excluded == "transformers 4.40.2 predates gemma2 (first in 4.42.0)"


def test_a_failure_a_family_cannot_have_is_excluded_with_why() -> None:
    # F23 needs a vision tower: in current (qwen2) and in current@phi3 it is excluded, in current@llava it runs.
    plan = plan_items(selection(cells=["current"], repros=["F23"], family=["qwen2,phi3,llava"]))
    reasons = {(e.cell, e.reason) for e in plan.excluded}
    why = "a text model: no vision tower for the attention names to reach"
    assert reasons == {("current", f"cannot occur in qwen2: {why}"), ("current@phi3", f"cannot occur in phi3: {why}")}
    assert {i.cell.name for i in plan.items} == {"current@llava"}
    # A matrix exclusion of the cell still comes first: F21 is excluded from current for its own reason.
    plan = plan_items(selection(cells=["current"], repros=["F21"], family=["llama"]))
    assert plan.items == [] and "cannot occur" not in plan.excluded[0].reason


def test_the_rerun_command_names_the_matrix_cell_and_the_family() -> None:
    opts = selection(cells=["current"], repros=["F1"], family=["phi3"])
    (item, _) = plan_items(opts).items
    command = repro_command(opts, item)
    assert "--cells current " in command and "--family phi3" in command and "current@phi3" not in command


def test_an_unknown_family_is_one_line_naming_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(UserError) as raised:
        selection(cells=["current"], family=["qwen3"])
    line = raised.value.line()
    assert "--family" in line and "qwen3" in line and "qwen2-moe" in line and len(line.splitlines()) == 1
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "run",
            "--cells",
            "current",
            "--family",
            "qwen3",
            "--out",
            str(tmp_path / "o"),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr and "unknown model family" in done.stderr


def test_grid_only_family_selects_cells_not_combinations() -> None:
    assert family_restriction(["engine=ddp", "family=llama,gemma2"]) == (["engine=ddp"], ["llama", "gemma2"])
    with pytest.raises(UserError, match="bert: unknown model family"):
        family_restriction(["family=bert"])
    with pytest.raises(UserError, match="names no family"):
        family_restriction(["family="])


def test_a_matrix_cell_can_name_its_own_family(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    cells = {"a": {"provider": "passthrough", "lanes": ["x"], "family": "mistral"}}
    path.write_text(yaml.safe_dump({"version": 1, "lanes": {"x": "one"}, "cells": cells}))
    opts = options.selection({"matrix": path, "repros": ["F1"]}, cwd=tmp_path)
    assert {i.cell.family for i in plan_items(opts).items} == {"mistral"}
    cells["a"]["family"] = "gpt2"
    path.write_text(yaml.safe_dump({"version": 1, "lanes": {"x": "one"}, "cells": cells}))
    with pytest.raises(UserError) as raised:
        options.selection({"matrix": path, "repros": ["F1"]}, cwd=tmp_path)
    assert "family" in raised.value.line()
