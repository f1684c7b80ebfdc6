"""The bisect command's pieces: what counts as bad, the endpoints, the final line."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.version import Version

from harness.config.matrix import load_matrix
from harness.config.repros import discover
from harness.core.errors import UserError
from harness.environments.releases import between, parse_available
from harness.pipeline.executors import local as local_executor
from harness.planning.commands import run_command
from harness.planning.run_options import CacheChoice, RunOptions, StackChoice, pinned_cell
from harness.records.item import ItemRecord, parse_record
from harness.workflows.bisect import runner as bisect_mod
from harness.workflows.bisect.axes import final_line
from harness.workflows.bisect.runner import BisectOptions, base_cell, bisect_points, state_of
from harness.workflows.bisect.search import Probe, SearchResult
from repros.runtime.spec import MODES
from tests.support.paths import REPO_ROOT

BAD = ("REPRODUCED", "F1.recompute-shape-0")


GOOD = ("NOT_REPRODUCED", None)


def observed(outcome: str, signature: str | None = None, **fields: object) -> ItemRecord:
    """An item's record as ``observe_item`` returns it, with what a step reads set."""
    return parse_record(
        {
            "schema_version": 1,
            "run_id": "RUN",
            "cell": "current",
            "repro": "F1",
            "mode": "bug",
            "outcome": outcome,
            "signature": signature,
            "expected": None,
            "matched": True,
            "versions": {},
            "world_size": 2,
            "device": "cpu",
            "wall_s": 1.0,
            "error": None,
            "reasons": [],
            "guards": [],
            "env": {"key": "key", "path": "/e", "python": "/x", "reused": True, "build_s": 0.0},
            "repro_cmd": "python -m harness run",
            "started_at": "2026-01-01T00:00:00Z",
            "finished_at": "2026-01-01T00:00:01Z",
            **fields,
        }
    )


def test_bad_and_good_mean_what_each_endpoint_showed_and_anything_else_is_other() -> None:
    assert state_of(observed("REPRODUCED", "F1.recompute-shape-0"), BAD, GOOD) == "bad"
    assert state_of(observed("NOT_REPRODUCED", None), BAD, GOOD) == "good"
    # Another failure is neither endpoint's: never counted as good (nor as bad).
    assert state_of(observed("DIFFERENT_ERROR", None), BAD, GOOD) == "other"
    assert state_of(observed("REPRODUCED", "F1.other"), BAD, GOOD) == "other"
    for outcome in ("UNRESOLVABLE", "INFRA", "HANG"):
        assert state_of(observed(outcome, None), BAD, GOOD) == "skip"


@pytest.mark.parametrize(
    ("releases", "final_line_expected", "code"),
    [
        # The pre-release cannot run the job at all: it is never called "first good"; beside the
        # boundary, it leaves the answer open between it and the next release.
        (
            ["4.57.6", "5.0.0rc0", "5.0.0", "5.1.0", "5.23.0"],
            "first good: ambiguous, one of transformers==5.0.0rc0, transformers==5.0.0 (no verdict on: 5.0.0rc0)"
            "; transformers==5.0.0rc0 failed differently (ImportError)",
            1,
        ),
        # Away from the boundary, it is searched around, and still named.
        (
            ["4.57.6", "4.58.0", "5.0.0rc0", "5.0.0rc1", "5.0.0", "5.23.0"],
            "first good: transformers==5.0.0; transformers==5.0.0rc0 failed differently (ImportError)",
            0,
        ),
    ],
)
def test_a_release_that_failed_differently_is_never_good_and_is_named(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    releases: list[str],
    final_line_expected: str,
    code: int,
) -> None:
    from rich.console import Console

    from harness.environments import Environment, Resolved

    monkeypatch.setattr(bisect_mod, "released_versions", lambda package, pre=False: [Version(v) for v in releases])

    class FakeEnvironments:
        def __init__(self, cache_dir: Path, **_: object) -> None:
            pass

        def release(self, env: Environment) -> None:
            pass

        def cached(self, cell: object) -> bool:
            return True

        def for_cell(self, cell):  # type: ignore[no-untyped-def]
            packages = {k: v.lstrip("=") for k, v in cell.packages.items()}
            return Resolved(Environment(cell.name, "py", "3.11.7", packages, "/e", "/x", True, 0.0))

    def fake_observe(job, resolved, *_, **__):  # type: ignore[no-untyped-def]
        version = Version(resolved.env.packages["transformers"])
        if version == Version("5.0.0rc0"):  # the job cannot even start on this pre-release
            error = {"type": "ImportError", "message": "cannot import name 'x'", "rank": 0}
            return observed("DIFFERENT_ERROR", None, repro="F5", error=error)
        if version < Version("5.0.0"):
            return observed("REPRODUCED", "F5.no-grad-fn", repro="F5", error=None)
        return observed("NOT_REPRODUCED", None, repro="F5", error=None)

    monkeypatch.setattr(bisect_mod, "Environments", FakeEnvironments)
    monkeypatch.setattr(local_executor, "observe_item", fake_observe)
    opts = options(
        repro="F5",
        package="transformers",
        good="5.23.0",
        bad="4.57.6",
        cache_dir=tmp_path,
        out_dir=tmp_path / "out",
        pre=True,
    )
    assert bisect_mod.execute_bisect(opts, Console(file=open(tmp_path / "console.txt", "w"))) == code
    assert capsys.readouterr().out.strip().splitlines()[-1] == final_line_expected


def test_a_package_the_cell_does_not_install_is_refused() -> None:
    with pytest.raises(UserError) as info:
        bisect_mod.execute_bisect(options(package="no-such-package"), None)  # type: ignore[arg-type]
    assert info.value.where == "--package" and "does not install it" in info.value.problem


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


def options(cache_dir: Path = Path("/nonexistent"), out_dir: Path | None = None, **change: object) -> BisectOptions:
    discovery = discover()
    matrix = load_matrix(REPO_ROOT / "matrix.yaml", known_repros=discovery.repros.keys(), known_modes=MODES)
    run = RunOptions(matrix, discovery, cache=CacheChoice(resolved=cache_dir), out_dir=out_dir)
    values: dict[str, object] = dict(repro="F1", mode="bug", package="deepspeed", good="0.19.8", bad="0.19.2")
    values.update(change)
    return BisectOptions(run=run, **values)  # type: ignore[arg-type]


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
    assert base_cell(opts.run.matrix, None).name == "current"
    with pytest.raises(UserError):
        base_cell(opts.run.matrix, "passthrough")
    with pytest.raises(UserError):
        base_cell(opts.run.matrix, "nope")


def test_a_pinned_cell_keeps_its_origin_in_the_rerun_command() -> None:
    opts = options()
    cell = pinned_cell(opts.run.matrix.cells["current"], (("deepspeed", "==0.19.5"),))
    assert cell.packages["deepspeed"] == "==0.19.5" and cell.packages["peft"] == "==0.21.2"
    stack = StackChoice(pins=(("deepspeed", "==0.19.5"),), as_of="2025-03-25")
    cmd = run_command(opts.run.matrix.path, cell, "F1", "bug", stack, CacheChoice())
    assert "--cells current " in cmd and "--pin deepspeed==0.19.5" in cmd and "--as-of 2025-03-25" in cmd


def test_a_long_build_says_it_is_under_way_the_step_gives_its_size_and_the_end_says_what_next(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bisect whose steps build environments is never silent for minutes, says what each takes on
    disk, and after its final line (the last on stdout) says what to do with it."""
    import io
    import json
    import time

    from rich.console import Console

    from harness.environments import Environment, Resolved
    from harness.reports import progress

    releases = ["0.19.2", "0.19.3", "0.19.8"]
    monkeypatch.setattr(bisect_mod, "released_versions", lambda package, pre=False: [Version(v) for v in releases])
    monkeypatch.setattr(progress, "STILL_EVERY_S", 0.05)
    monkeypatch.setattr(bisect_mod, "still_under_way", lambda say, what: progress.still_under_way(say, what, 0.05))

    class BuildingEnvironments:
        def __init__(self, cache_dir: Path, **_: object) -> None:
            pass

        def release(self, env: Environment) -> None:
            pass

        def cached(self, cell: object) -> bool:
            return False

        def for_cell(self, cell):  # type: ignore[no-untyped-def]
            time.sleep(0.2)  # a build
            env_dir = tmp_path / "envs" / cell.name
            env_dir.mkdir(parents=True, exist_ok=True)
            (env_dir / "size.json").write_text(json.dumps({"apparent": 1_181_116_006}))
            packages = {k: v.lstrip("=") for k, v in cell.packages.items()}
            return Resolved(Environment(cell.name, "py", "3.11.7", packages, str(env_dir), "/x", False, 296.0))

    def fake_observe(job, resolved, *_, **__):  # type: ignore[no-untyped-def]
        env = {"key": "k", "path": resolved.env.path, "python": "/x", "reused": False, "build_s": 296.0}
        if Version(resolved.env.packages["deepspeed"]) < Version("0.19.3"):
            return observed("REPRODUCED", "F1.recompute-shape-0", error=None, env=env)
        return observed("NOT_REPRODUCED", None, error=None, env=env)

    monkeypatch.setattr(bisect_mod, "Environments", BuildingEnvironments)
    monkeypatch.setattr(local_executor, "observe_item", fake_observe)
    opts = options(package="deepspeed", good="0.19.8", bad="0.19.2", cache_dir=tmp_path, out_dir=tmp_path / "out")
    said = io.StringIO()
    assert bisect_mod.execute_bisect(opts, Console(file=said, width=200)) == 0
    shown = said.getvalue()
    assert "deepspeed==0.19.2: its environment: building it" in shown
    assert "deepspeed==0.19.2: its environment is being built:" in shown and "so far" in shown
    assert "environment built 296s, 1.1 GB" in shown
    out, err = capsys.readouterr()
    assert out.strip().splitlines()[-1] == "first good: deepspeed==0.19.3"
    assert err.startswith("next: the change is in deepspeed 0.19.3 (its changes since 0.19.2): upgrade to ")
    assert "--pin deepspeed==0.19.3" in err and str(tmp_path / "out" / "bisect.json") in err


def test_bisect_takes_its_base_cell_as_run_takes_cells_and_says_what_each_option_is(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from harness.cli.main import parser

    bisect = parser().parse_args(["bisect", "--repro", "F1", "--good", "1", "--bad", "2", "--cells", "tf4"])
    assert bisect.cell == "tf4"
    assert parser().parse_args(["bisect", "--repro", "F1", "--good", "1", "--bad", "2", "--cell", "tf4"]).cell == "tf4"
    with pytest.raises(SystemExit):
        parser().parse_args(["bisect", "--help"])
    shown = capsys.readouterr().out
    for flag in ("--repro REPRO", "--mode MODE", "--cells CELL, --cell CELL"):
        line = next(ln for ln in shown.splitlines() if ln.strip().startswith(flag))
        assert len(line.strip()) > len(flag) + 5 or flag == "--cells CELL, --cell CELL", line
    assert "the repro whose outcome changed" in shown and "the mode whose outcome changed" in shown
