"""The bisect command's pieces: what counts as bad, the endpoints, the final line."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.version import Version

from harness import bisect as bisect_mod
from harness.bisect import BisectOptions, base_cell, bisect_points, final_line, state_of
from harness.bisect_search import Probe, SearchResult
from harness.errors import UserError
from harness.matrix import load_matrix
from harness.package_versions import between, parse_available
from harness.repro_registry import discover
from harness.planning import pinned_cell
from harness.rerun import run_command
from tests.paths import REPO_ROOT
from repros.common.spec import MODES

BAD = ("REPRODUCED", "F1.recompute-shape-0")


def test_bad_means_the_bad_endpoints_outcome_and_signature() -> None:
    assert state_of({"outcome": "REPRODUCED", "signature": "F1.recompute-shape-0"}, BAD) == "bad"
    assert state_of({"outcome": "NOT_REPRODUCED", "signature": None}, BAD) == "good"
    # Another failure is not the bad endpoint's failure.
    assert state_of({"outcome": "DIFFERENT_ERROR", "signature": None}, BAD) == "good"
    assert state_of({"outcome": "REPRODUCED", "signature": "F1.other"}, BAD) == "good"
    for outcome in ("UNRESOLVABLE", "INFRA", "HANG"):
        assert state_of({"outcome": outcome, "signature": None}, BAD) == "skip"


def test_final_line_says_first_bad_or_first_good() -> None:
    assert final_line("peft", SearchResult("found", "regression", boundary="0.13.0")) == "first bad: peft==0.13.0"
    assert final_line("deepspeed", SearchResult("found", "fix", boundary="0.19.3")) == "first good: deepspeed==0.19.3"
    ambiguous = SearchResult("ambiguous", "fix", candidates=["0.19.3", "0.19.4"], skipped=["0.19.3"])
    assert final_line("deepspeed", ambiguous).startswith("first good: ambiguous, one of deepspeed==0.19.3")
    wobbly = SearchResult("non-monotonic", "regression", contradictions=[Probe("1.1", "bad", "verify")])
    assert "not monotonic (1.1 bad)" in final_line("peft", wobbly)
    assert "do not differ" in final_line("peft", SearchResult("endpoints-agree", "regression"))


def test_released_versions_are_parsed_and_filtered() -> None:
    text = "deepspeed (0.19.8)\nAvailable versions: 0.19.8, 0.19.7rc1, 0.19.3, 0.19.2, 0.18.9\n"
    versions = parse_available(text)
    assert versions[0] == Version("0.18.9") and versions[-1] == Version("0.19.8")
    assert [str(v) for v in between(versions, Version("0.19.2"), Version("0.19.8"))] == ["0.19.2", "0.19.3", "0.19.8"]
    assert Version("0.19.7rc1") in between(versions, Version("0.19.2"), Version("0.19.8"), pre=True)


def options(**change) -> BisectOptions:
    discovery = discover()
    matrix = load_matrix(REPO_ROOT / "matrix.yaml", known_repros=discovery.repros.keys(), known_modes=MODES)
    values = dict(
        matrix=matrix,
        discovery=discovery,
        repro="F1",
        mode="bug",
        package="deepspeed",
        good="0.19.8",
        bad="0.19.2",
        cache_dir=Path("/nonexistent"),
    )
    values.update(change)
    return BisectOptions(**values)


def test_endpoints_must_be_released_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        bisect_mod, "released_versions", lambda package, pre=False: [Version(v) for v in ("0.19.2", "0.19.3", "0.19.8")]
    )
    assert [str(v) for v in bisect_points(options())] == ["0.19.2", "0.19.3", "0.19.8"]
    with pytest.raises(UserError) as info:
        bisect_points(options(good="0.19.99"))
    assert info.value.field == "0.19.99" and "not on the index" in info.value.problem
    with pytest.raises(UserError):
        bisect_points(options(good="0.19.2"))
    with pytest.raises(UserError):
        bisect_points(options(good="zero"))


def test_base_cell_defaults_to_the_default_lane_and_refuses_passthrough() -> None:
    opts = options()
    assert base_cell(opts.matrix, None).name == "current"
    with pytest.raises(UserError):
        base_cell(opts.matrix, "passthrough")
    with pytest.raises(UserError):
        base_cell(opts.matrix, "nope")


def test_a_pinned_cell_keeps_its_origin_in_the_rerun_command() -> None:
    opts = options()
    cell = pinned_cell(opts.matrix.cells["current"], (("deepspeed", "==0.19.5"),))
    assert cell.packages["deepspeed"] == "==0.19.5" and cell.packages["peft"] == "==0.21.2"
    cmd = run_command(opts.matrix.path, cell, "F1", "bug", (("deepspeed", "==0.19.5"),), None)
    assert "--cells current " in cmd and "--pin deepspeed==0.19.5" in cmd
