"""``ft-regress check`` for real, in an interpreter that holds a torch stack and the harness: the stack of
issue 39's bar (torch 2.13.0, deepspeed 0.19.2, peft 0.21.2, transformers 5.23.0, accelerate 1.15.0, no
bitsandbytes), built by the harness's own provider, with the orchestrator layered over it as a runner
installs it (tools/venv_over.sh). F1 is had and named; what needs bitsandbytes cannot run and says so;
F12 cannot occur at one rank and says so; exit 1."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

from harness.config.matrix import load_matrix
from harness.environments import Environments, default_cache_dir
from repros.runtime.spec import MODES
from tests.support.paths import REPO_ROOT, results_json

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stack_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("check-stack")
    shipped = yaml.safe_load((REPO_ROOT / "matrix.yaml").read_text())
    matrix = {
        "version": 1,
        "lanes": {"stack": "the bar's stack"},
        "defaults": shipped["defaults"],
        "cells": {"stack": {"packages": {"deepspeed": "==0.19.2", "bitsandbytes": None}, "lanes": ["stack"]}},
    }
    (work / "matrix.yaml").write_text(yaml.safe_dump(matrix))
    cell = load_matrix(work / "matrix.yaml", known_repros=[], known_modes=MODES).cells["stack"]
    resolved = Environments(default_cache_dir()).for_cell(cell)
    assert resolved.env is not None, resolved.reason
    venv = work / "venv"
    made = subprocess.run(
        [str(REPO_ROOT / "tools" / "venv_over.sh"), resolved.env.python, str(venv)],
        capture_output=True,
        text=True,
        check=True,
    )
    python = Path(made.stdout.strip())
    # The harness (this checkout, installed editable) and its light dependencies, beside the stack.
    own = subprocess.run(
        [str(python), "-c", "import site; print(site.getsitepackages()[0])"], capture_output=True, text=True, check=True
    ).stdout.strip()
    orchestrator = sysconfig.get_paths()["purelib"]
    Path(own, "zz-orchestrator.pth").write_text(f"import site; site.addsitedir({orchestrator!r})\n")
    return python


def test_check_names_what_the_stack_has_and_what_cannot_run_here(stack_python: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "FT_REGRESS_MATRIX")}
    done = subprocess.run(
        [str(stack_python), "-m", "harness", "check", "--repros", "F1,F3,F12,F14", "--world-size", "1"]
        + ["--out", str(tmp_path / "out")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    said = done.stdout + done.stderr
    assert done.returncode == 1, said[-4000:]
    lines = {line[:4].strip(): line for line in said.splitlines() if line[:1] == "F" and line[1:2].isdigit()}
    assert lines["F1"].startswith("F1   has it: REPRODUCED F1.recompute-shape-0"), said[-4000:]
    assert "this stack has F1; 3 could not run here" in said
    for repro in ("F3", "F14"):
        assert (
            f"{repro}" in lines
            and "cannot run here" in lines[repro]
            and "bitsandbytes is not installed" in lines[repro]
        )
    assert "cannot run here: excluded: F12 cannot occur at world size 1" in lines["F12"]
    records = {(r["repro"], r["mode"]): r for r in results_json(tmp_path / "out" / "results.jsonl")}
    assert records[("F1", "fixed")]["outcome"] == "PASS"
    for key in (("F3", "fixed"), ("F14", "fixed"), ("F3", "bug"), ("F14", "bug")):
        assert records[key]["outcome"] == "INFRA" and "bitsandbytes" in records[key]["reasons"][0]
    assert ("F12", "bug") not in records
    # The versions are what the ranks imported: the stack's own deepspeed, and no bitsandbytes.
    assert records[("F1", "bug")]["versions"]["deepspeed"] == "0.19.2"
    assert records[("F1", "bug")]["versions"]["bitsandbytes"] is None
    assert records[("F1", "bug")]["env"]["python"] == str(stack_python)
    assert sys.executable != str(stack_python)
