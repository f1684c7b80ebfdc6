"""matrix.yaml validation: every user mistake is one line naming file, field and fix."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.config.matrix import load_matrix
from harness.config.repros import discover
from harness.core.errors import UserError
from repros.runtime.spec import MODES
from tests.support.paths import REPO_ROOT

REPROS = ("F1", "F5")

GOOD = """
version: 1
default_lane: fast
lanes: {fast: "quick", slow: ""}
defaults:
  world_size: 2
  packages: {torch: "==2.13.0", deepspeed: "==0.19.8", bitsandbytes: "==0.50.2"}
cells:
  alpha:
    lanes: [fast]
  beta:
    packages: {deepspeed: "==0.19.2", bitsandbytes: null}
    lanes: [fast, slow]
    world_size: 1
exclude:
  - {cell: beta, repro: F5, reason: "needs two ranks"}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def load(path: Path):
    return load_matrix(path, known_repros=REPROS, known_modes=MODES)


def error_for(tmp_path: Path, text: str) -> UserError:
    with pytest.raises(UserError) as info:
        load(write(tmp_path, text))
    return info.value


def test_cells_inherit_defaults_and_override_what_they_name(tmp_path: Path) -> None:
    m = load(write(tmp_path, GOOD))
    assert m.cells["alpha"].packages == {"torch": "==2.13.0", "deepspeed": "==0.19.8", "bitsandbytes": "==0.50.2"}
    assert m.cells["beta"].packages == {"torch": "==2.13.0", "deepspeed": "==0.19.2"}  # null leaves it out
    assert m.cells["alpha"].world_size == 2 and m.cells["beta"].world_size == 1
    assert [c.name for c in m.cells_in_lane("slow")] == ["beta"]
    assert m.default_lane == "fast"
    assert m.exclusion("beta", "F5", "bug").reason == "needs two ranks"
    assert m.exclusion("alpha", "F5", "bug") is None
    assert len(m.sha256) == 64


def test_the_shipped_matrix_has_a_ci_lane_with_both_f1_cells() -> None:
    m = load_matrix(REPO_ROOT / "matrix.yaml", known_repros=discover().repros.keys(), known_modes=MODES)
    deepspeeds = {c.packages["deepspeed"] for c in m.cells_in_lane("ci")}
    assert {"==0.19.2", "==0.19.8"} <= deepspeeds


def test_the_shipped_ci_lane_holds_only_torch_2_13_and_nightly_holds_every_built_cell() -> None:
    m = load_matrix(REPO_ROOT / "matrix.yaml", known_repros=discover().repros.keys(), known_modes=MODES)
    assert {c.packages["torch"] for c in m.cells_in_lane("ci")} == {"==2.13.0"}
    built = {c.name for c in m.cells.values() if c.provider != "passthrough" and c.model == "tiny" and not c.floating}
    assert {c.name for c in m.cells_in_lane("nightly")} == built
    # The watch lane floats: every package resolves afresh each night; next allows release candidates.
    watch = {c.name: c for c in m.cells_in_lane("watch")}
    assert set(watch) == {"latest", "next"} and all(set(c.floating) == set(c.packages) for c in watch.values())
    assert watch["next"].prerelease and not watch["latest"].prerelease
    # The perf lane: stacks of the ci lane, at the small model.
    perf = m.cells_in_lane("perf")
    assert perf and all(c.model == "small" for c in perf)
    ci_stacks = [c.packages for c in m.cells_in_lane("ci")]
    assert all(c.packages in ci_stacks for c in perf)
    assert any(c.packages["torch"] != "==2.13.0" for c in m.cells_in_lane("nightly"))
    for excluded in m.excludes:
        assert excluded.reason.strip()


def test_unknown_key_names_the_field_and_allowed_keys(tmp_path: Path) -> None:
    err = error_for(tmp_path, GOOD.replace("world_size: 1", "wrold_size: 1"))
    assert err.field == "cells.beta.wrold_size"
    assert "unknown key 'wrold_size'" in err.problem
    assert "world_size" in err.fix


def test_unknown_top_level_key(tmp_path: Path) -> None:
    err = error_for(tmp_path, GOOD + "\nextras: 1\n")
    assert err.field == "extras" and "cells" in err.fix


@pytest.mark.parametrize("spec", ["==0.19,2", "0.19.2", "==2.0; rm -rf ~", "==2.0 && echo", "$(id)", ">=1 <2"])
def test_invalid_specifier_is_refused_with_the_field(tmp_path: Path, spec: str) -> None:
    err = error_for(tmp_path, GOOD.replace('deepspeed: "==0.19.2"', f"deepspeed: {spec!r}"))
    assert err.field == "cells.beta.packages.deepspeed"
    assert "not a valid PEP 440" in err.problem
    assert "==" in err.fix


def test_empty_specifier_is_refused(tmp_path: Path) -> None:
    err = error_for(tmp_path, GOOD.replace('deepspeed: "==0.19.2"', 'deepspeed: ""'))
    assert err.field == "cells.beta.packages.deepspeed" and "null" in err.fix


def test_unknown_lane_in_a_cell(tmp_path: Path) -> None:
    err = error_for(tmp_path, GOOD.replace("lanes: [fast, slow]", "lanes: [fast, nightyl]"))
    assert err.field == "cells.beta.lanes[1]" and "nightyl" in err.problem and "fast" in err.fix
    # Lanes must be declared even where the matrix declares none at all: a typo is not a new lane.
    undeclared = error_for(tmp_path, GOOD.replace('lanes: {fast: "quick", slow: ""}\n', ""))
    assert undeclared.field == "cells.alpha.lanes[0]" and "declare it under 'lanes:'" in undeclared.fix


def test_unknown_lane_requested(tmp_path: Path) -> None:
    m = load(write(tmp_path, GOOD))
    with pytest.raises(UserError) as info:
        m.cells_in_lane("nope")
    assert "fast" in info.value.fix and "slow" in info.value.fix


def test_unknown_repro_in_exclude(tmp_path: Path) -> None:
    err = error_for(tmp_path, GOOD.replace("repro: F5", "repro: F9"))
    assert err.field == "exclude[0].repro" and "F9" in err.problem and "F1" in err.fix


def test_an_exclude_may_name_a_list_of_repros_each_excluded_with_its_reason(tmp_path: Path) -> None:
    m = load(write(tmp_path, GOOD.replace("repro: F5", "repro: [F1, F5]")))
    assert {(e.cell, e.repro, e.reason) for e in m.excludes} == {
        ("beta", "F1", "needs two ranks"),
        ("beta", "F5", "needs two ranks"),
    }
    assert m.exclusion("beta", "F1", "bug") and m.exclusion("beta", "F5", "fixed")
    assert m.exclusion("alpha", "F1", "bug") is None
    err = error_for(tmp_path, GOOD.replace("repro: F5", "repro: [F1, F9]"))
    assert err.field == "exclude[0].repro[1]" and "F9" in err.problem


def test_exclude_needs_a_reason(tmp_path: Path) -> None:
    err = error_for(tmp_path, GOOD.replace(', reason: "needs two ranks"', ""))
    assert err.field == "exclude.0" and "reason" in err.problem


def test_malformed_yaml_names_the_line(tmp_path: Path) -> None:
    err = error_for(tmp_path, "version: 1\ncells:\n  a: [unclosed\n")
    assert "line" in err.field and "not valid YAML" in err.problem


def test_a_key_written_twice_is_refused(tmp_path: Path) -> None:
    err = error_for(tmp_path, GOOD.replace("  beta:", "  alpha:\n    lanes: [slow]\n  beta:"))
    assert "appears twice" in err.problem


def test_bad_cell_name_is_refused(tmp_path: Path) -> None:
    err = error_for(tmp_path, GOOD.replace("  alpha:", "  ../evil:"))
    assert "not an allowed name" in err.problem


def test_nothing_depends_on_a_cell_name(tmp_path: Path) -> None:
    renamed = GOOD.replace("alpha", "my-stack").replace("beta", "zz.1")
    m = load(write(tmp_path, renamed))
    assert sorted(m.cells) == ["my-stack", "zz.1"]
    assert m.exclusion("zz.1", "F5", "fixed") is not None


def test_cli_exits_2_with_one_line_and_runs_nothing(tmp_path: Path) -> None:
    bad = write(tmp_path, GOOD.replace('deepspeed: "==0.19.2"', 'deepspeed: "==0.19,2"'))
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "run", "--matrix", str(bad), "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert str(bad) in lines[0] and "cells.beta.packages.deepspeed" in lines[0] and "PEP 440" in lines[0]
    assert not out.exists()


def test_cli_refuses_unknown_repro_and_lane(tmp_path: Path) -> None:
    good = write(tmp_path, GOOD.replace("repro: F5", "repro: F1"))  # only repros that exist here
    for extra, needle in (
        (["--repros", "F1,F42"], "F42"),
        (["--lane", "weekly"], "weekly"),
        (["--cells", "gamma"], "gamma"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "harness", "run", "--matrix", str(good), "--out", str(tmp_path / "o"), *extra],
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,
        )
        assert proc.returncode == 2, proc.stderr
        assert needle in proc.stderr and proc.stderr.count("\n") == 1


def test_cli_refuses_a_malformed_pin(tmp_path: Path) -> None:
    good = write(tmp_path, GOOD.replace("repro: F5", "repro: F1"))
    for pin in ("deepspeed==0.19.5; rm -rf ~", "deepspeed", "git+https://example.invalid/x"):
        proc = subprocess.run(
            [sys.executable, "-m", "harness", "run", "--matrix", str(good), "--out", str(tmp_path / "o"), "--pin", pin],
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,
        )
        assert proc.returncode == 2, (pin, proc.stderr)
        assert proc.stderr.startswith("error: --pin:") and proc.stderr.count("\n") == 1


def test_cli_refuses_an_unwritable_output_directory(tmp_path: Path) -> None:
    good = write(tmp_path, GOOD.replace("repro: F5", "repro: F1"))
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "run", "--matrix", str(good), "--out", str(blocker / "out")],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 2, proc.stderr
    assert (
        proc.stderr.startswith(f"error: {blocker / 'out'}: --out: cannot be written") and proc.stderr.count("\n") == 1
    )


def test_cli_refuses_to_mix_a_new_run_into_old_results(tmp_path: Path) -> None:
    good = write(tmp_path, GOOD.replace("repro: F5", "repro: F1"))
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.jsonl").write_text('{"kept": true}\n')
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "run", "--matrix", str(good), "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 2 and "already holds the results of another run" in proc.stderr
    assert (out / "results.jsonl").read_text() == '{"kept": true}\n'


def test_a_bad_value_names_its_own_field_not_an_unknown_key(tmp_path: Path) -> None:
    err = error_for(tmp_path, GOOD.replace("    world_size: 1", "    world_size: 0"))
    assert err.field == "cells.beta.world_size" and "minimum" in err.problem and "unknown key" not in err.problem


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", "0", "1.0e+9"])
def test_a_timeout_that_is_no_timeout_is_refused(tmp_path: Path, value: str) -> None:
    # NaN would make every item a false HANG, infinity would never time out.
    err = error_for(tmp_path, GOOD.replace("  world_size: 2\n", f"  world_size: 2\n  timeout_s: {value}\n"))
    assert err.field == "defaults.timeout_s"


@pytest.mark.parametrize("other", ["Torch", "TORCH"])
def test_two_spellings_of_one_package_are_refused(tmp_path: Path, other: str) -> None:
    err = error_for(
        tmp_path, GOOD.replace('packages: {torch: "==2.13.0",', f'packages: {{torch: "==2.13.0", {other}: "==2.12.1",')
    )
    assert err.field == f"defaults.packages.{other}" and "same package as 'torch'" in err.problem


def test_underscore_and_dash_spellings_are_one_package(tmp_path: Path) -> None:
    text = GOOD.replace(
        'packages: {deepspeed: "==0.19.2", bitsandbytes: null}',
        'packages: {my_team_ops: "==1.0", my-team-ops: "==2.0"}',
    )
    err = error_for(tmp_path, text)
    assert err.field == "cells.beta.packages.my-team-ops" and "my_team_ops" in err.problem


def test_a_yaml_alias_bomb_is_refused_before_it_expands(tmp_path: Path) -> None:
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{name}: &{name} [{', '.join([f'*{prev}'] * 10)}]\n" for prev, name in zip("abcdefgh", "bcdefghi", strict=True)
    )
    err = error_for(tmp_path, bomb + GOOD)
    assert "expands to" in err.problem and "YAML aliases" in err.problem


def test_a_value_shared_through_an_alias_is_fine(tmp_path: Path) -> None:
    # What yaml.safe_dump writes for two cells built from one dict.
    shared = GOOD.replace("  alpha:\n    lanes: [fast]\n", "  alpha: &twin\n    lanes: [fast]\n  gamma: *twin\n")
    m = load(write(tmp_path, shared))
    assert m.cells["gamma"].lanes == m.cells["alpha"].lanes == ("fast",)


def test_a_huge_matrix_file_is_refused(tmp_path: Path) -> None:
    err = error_for(tmp_path, GOOD + "#" + "x" * (2 << 20) + "\n")
    assert "more than a matrix needs" in err.problem
