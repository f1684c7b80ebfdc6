"""A plain training script as a repro: a few declared lines beside it, run by the real orchestrator
(ranks under the stand-in torchrun of tests/fake_stack.py), explored, and its observations saved
back as expectations."""

from __future__ import annotations

import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from harness.config.repros import discover
from harness.records.results import read_results
from tests.support import fake_stack

SCRIPT = textwrap.dedent('''
    """A user's training script: what it does depends on its arguments, like a real one."""
    import argparse, json, os, sys
    import my_helper  # a module beside the script

    parser = argparse.ArgumentParser()
    parser.add_argument("--behave", default="declared")
    args = parser.parse_args()
    with open(f"seen-rank{os.environ['RANK']}.json", "w") as fh:  # in its working directory
        json.dump({"argv": sys.argv, "cwd": os.getcwd(), "world": os.environ["WORLD_SIZE"],
                   "main": __name__}, fh)
    if args.behave == "declared":
        raise RuntimeError(f"{my_helper.SYMPTOM} on rank {os.environ['RANK']}")
    if args.behave == "other":
        raise KeyError("something else")
    if args.behave == "exit3":
        sys.exit(3)
    if args.behave == "subclass":
        raise my_helper.NoMatchingModuleError(f"{my_helper.SYMPTOM}: no module matched")
''')

DECLARATION = textwrap.dedent("""
    # my repro: the script, how it is run, the error it fails with
    repro:
      id: mine
      script: train.py
      args: [--behave, {behave}]
      fails_with:
        type: RuntimeError
        pattern: "gradients vanished"
      fixed:
        args: [--behave, clean]
""")


def project(tmp_path: Path, behave: str = "declared") -> tuple[Path, dict[str, str]]:
    """A user's directory: a matrix of one cell, the script, a helper, the declaration, a config file."""
    env = fake_stack.run_env(fake_stack.install(tmp_path))
    env["FT_REGRESS_CACHE"] = str(tmp_path / "cache")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "train.py").write_text(SCRIPT)
    (mine / "my_helper.py").write_text(
        'SYMPTOM = "gradients vanished"\n\n\nclass NoMatchingModuleError(RuntimeError):\n    pass\n'
    )
    (mine / "ds_config.yaml").write_text("zero_optimization: {stage: 3}\n")  # a YAML file, not a repro
    (mine / "repro.yaml").write_text(DECLARATION.format(behave=behave))
    fake_stack.write_matrix(tmp_path / "matrix.yaml", ["a"])
    return mine, env


def harness(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )


def test_only_files_that_declare_a_repro_are_loaded(tmp_path: Path) -> None:
    mine, _ = project(tmp_path)
    (mine / "inline.py").write_text(
        'REPRO = {"id": "inline", "fails_with": {"type": "ValueError", "pattern": "x"}}\nraise ValueError("x")\n'
    )
    found = discover([mine])
    assert {r for r in found.repros if not r.startswith("F")} == {"mine", "inline"} and found.broken == {}
    assert found.repros["inline"].rank_params["script_repro"]["command"]["path"] == str(mine / "inline.py")
    assert found.repros["mine"].spec.modes == ("bug", "fixed")


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (("fails_with:", "fails_wth:"), "repro.yaml: fails_wth: is not a known field; did you mean 'fails_with'?"),
        (
            ("type: RuntimeError", "type: CheckpointError"),
            "fails_with.type: 'CheckpointError' is not a built-in exception; write it with its module",
        ),
        (
            ('pattern: "gradients vanished"', 'pattern: "gradients ("'),
            "fails_with.pattern: is not a regular expression",
        ),
        (("script: train.py", "script: trian.py"), "script: 'trian.py' is not a file"),
    ],
)
def test_a_declaration_mistake_names_the_file_the_field_and_the_fix(
    tmp_path: Path, change: tuple[str, str], said: str
) -> None:
    mine, _ = project(tmp_path)
    declaration = mine / "repro.yaml"
    declaration.write_text(declaration.read_text().replace(*change))
    broken = discover([mine]).broken["repro"]
    assert said in broken.reason and str(declaration) in broken.reason


def test_the_script_runs_as_torchrun_would_and_its_declared_error_is_reproduced(tmp_path: Path) -> None:
    mine, env = project(tmp_path)
    done = harness(tmp_path, env, "run", "--repros-dir", "mine", "--out", "out")
    assert done.returncode == 0, done.stdout + done.stderr  # no expectations: explored, a finding
    records = {r.mode: r for r in read_results(tmp_path / "out" / "results.jsonl")}
    assert set(records) == {"bug", "fixed"}  # only the repros asked for: not F1-F5
    bug, fixed = records["bug"], records["fixed"]
    assert (bug.outcome, bug.signature, bug.explored) == ("REPRODUCED", "mine.declared", True)
    assert bug.error is not None and bug.error.message == "gradients vanished on rank 0"
    assert fixed.outcome == "PASS"
    seen = yaml.safe_load((mine / "seen-rank1.json").read_text())
    assert seen == {
        "argv": [str(mine / "train.py"), "--behave", "clean"],
        "cwd": str(mine),
        "world": "2",
        "main": "__main__",
    }
    assert "fails as declared in a: REPRODUCED [mine.declared]" in done.stdout
    assert "keep them as expectations: the same command with --save-expectations" in done.stdout
    assert "2 items explored (observations, not checked against expectations)" in done.stdout
    assert "0 of" not in done.stdout  # nothing was checked: nothing reads as failed


@pytest.mark.parametrize(
    ("behave", "outcome", "error"),
    [
        ("clean", "NOT_REPRODUCED", None),
        ("other", "DIFFERENT_ERROR", "KeyError"),
        ("exit3", "DIFFERENT_ERROR", "SystemExit"),
    ],
)
def test_a_script_that_runs_clean_or_fails_otherwise_is_told_apart(
    tmp_path: Path, behave: str, outcome: str, error: str | None
) -> None:
    _, env = project(tmp_path, behave)
    done = harness(tmp_path, env, "run", "--repros-dir", "mine", "--modes", "bug", "--out", "out")
    (record,) = read_results(tmp_path / "out" / "results.jsonl")
    assert record.outcome == outcome, done.stdout
    assert (record.error.type if record.error else None) == error


def test_explore_exits_1_when_something_could_not_run(tmp_path: Path) -> None:
    mine, env = project(tmp_path)
    (mine / "train.py").write_text("import time\ntime.sleep(60)\n")
    fake_stack.write_matrix(tmp_path / "matrix.yaml", ["a"], extra={"defaults": {"world_size": 1, "timeout_s": 2}})
    done = harness(tmp_path, env, "run", "--repros-dir", "mine", "--modes", "bug", "--out", "out")
    (record,) = read_results(tmp_path / "out" / "results.jsonl")
    assert record.outcome == "HANG" and record.explored
    assert done.returncode == 1


def test_saved_expectations_are_matched_by_the_next_run_and_the_declaration_keeps_its_comments(tmp_path: Path) -> None:
    mine, env = project(tmp_path)
    saved = harness(tmp_path, env, "run", "--repros-dir", "mine", "--save-expectations", "--out", "first")
    assert saved.returncode == 0, saved.stdout + saved.stderr
    text = (mine / "repro.yaml").read_text()
    assert text.startswith("\n# my repro: the script, how it is run, the error it fails with\nrepro:\n")
    expectations = yaml.safe_load(text)["repro"]["expectations"]
    assert [(e["mode"], e["outcome"]) for e in expectations] == [("bug", "REPRODUCED"), ("fixed", "PASS")]
    command = shlex.split(expectations[0]["established_by"].split(" (")[0])
    # As the user would type it where they ran it: the program, paths relative there, no flag they never gave.
    assert command[:4] == [sys.executable, "-m", "harness", "run"] or command[:2] == ["python", "-m"]
    assert command[command.index("--repros-dir") + 1] == "mine"
    assert "--explore" not in command and "--matrix" not in command
    again = harness(tmp_path, env, "run", "--repros-dir", "mine", "--out", "second")
    assert again.returncode == 0, again.stdout
    assert all(r.matched and not r.explored for r in read_results(tmp_path / "second" / "results.jsonl"))
    assert "2 of 2 items matched their expectation" in again.stdout


def test_a_python_declaration_gets_its_expectations_in_its_repro_literal(tmp_path: Path) -> None:
    _, env = project(tmp_path)
    mine = tmp_path / "py"
    mine.mkdir()
    (mine / "job.py").write_text(
        textwrap.dedent("""
        import os
        REPRO = {
            "id": "job",
            "world_size": 1,
            "fails_with": {"type": "ValueError", "pattern": "boom"}  # what it raises
        }
        if __name__ == "__main__":
            raise ValueError("boom")
    """)
    )
    done = harness(tmp_path, env, "run", "--repros-dir", "py", "--save-expectations", "--out", "out")
    assert done.returncode == 0, done.stdout + done.stderr
    source = (mine / "job.py").read_text()
    assert '"fails_with": {"type": "ValueError", "pattern": "boom"},  # what it raises' in source
    assert discover([mine]).repros["job"].spec.expectations[0].outcome == "REPRODUCED"


def test_the_printed_rerun_command_works_from_elsewhere_without_the_variable_that_found_the_repro(
    tmp_path: Path,
) -> None:
    _, env = project(tmp_path)
    done = harness(
        tmp_path,
        {**env, "FT_REGRESS_REPROS": str(tmp_path / "mine")},
        "run",
        "--repros",
        "mine",
        "--modes",
        "bug",
        "--out",
        "out",
    )
    (record,) = read_results(tmp_path / "out" / "results.jsonl")
    command = shlex.split(record.repro_cmd)
    assert command[:4] == ["python", "-m", "harness", "run"] and "--repros-dir" in command, record.repro_cmd
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    rerun = subprocess.run(
        [sys.executable, *command[1:], "--out", str(elsewhere / "out")],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    (again,) = read_results(elsewhere / "out" / "results.jsonl")
    same = (again.outcome, again.repro_cmd) == (record.outcome, record.repro_cmd)
    assert same, rerun.stdout + done.stdout


def test_save_expectations_saves_what_the_last_run_observed_without_running_again(tmp_path: Path) -> None:
    mine, env = project(tmp_path)
    explored = harness(tmp_path, env, "run", "--repros-dir", "mine")
    assert explored.returncode == 0, explored.stdout + explored.stderr
    runs = sorted((tmp_path / "reports").iterdir())
    saved = harness(tmp_path, env, "run", "--repros-dir", "mine", "--save-expectations")
    assert saved.returncode == 0, saved.stdout + saved.stderr
    assert (
        f"saving what reports/{runs[0].name} observed (2 items" in saved.stdout and "nothing runs again" in saved.stdout
    )
    assert sorted((tmp_path / "reports").iterdir()) == runs  # no run
    expectations = yaml.safe_load((mine / "repro.yaml").read_text())["repro"]["expectations"]
    assert [(e["mode"], e["outcome"]) for e in expectations] == [("bug", "REPRODUCED"), ("fixed", "PASS")]
    # The declaration changed since: the next save runs the items again.
    again = harness(tmp_path, env, "run", "--repros-dir", "mine", "--save-expectations")
    assert "nothing runs again" not in again.stdout and len(list((tmp_path / "reports").iterdir())) == 2


@pytest.mark.parametrize(
    ("behave", "hint"),
    [
        (
            "subclass",
            "the message matches mine.declared's pattern, but the error is my_helper.NoMatchingModuleError, a "
            "subclass of the declared RuntimeError: declare the type as the traceback prints it, "
            "my_helper.NoMatchingModuleError",
        ),
        (
            "other",
            "the declared error (RuntimeError matching 'gradients vanished') never appeared: rank 0 raised "
            "KeyError: 'something else'",
        ),
    ],
)
def test_a_different_error_says_how_it_missed_the_declared_one(tmp_path: Path, behave: str, hint: str) -> None:
    _, env = project(tmp_path, behave)
    done = harness(tmp_path, env, "run", "--repros-dir", "mine", "--modes", "bug", "--out", "out")
    (record,) = read_results(tmp_path / "out" / "results.jsonl")
    assert record.outcome == "DIFFERENT_ERROR" and record.reasons == [hint]
    assert f"    hint: {hint}" in done.stdout
