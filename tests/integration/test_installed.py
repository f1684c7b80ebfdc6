"""The harness installed from its wheel, run from a directory outside the repository.

Only the worker package may reach a cell's interpreter: a rank must import every
third-party package from its own cell, never from the orchestrator's environment (whose
numpy is 2.x here, pulled in by matplotlib), and must not see the orchestrator's own code.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.support.paths import REPO_ROOT, results_json

pytestmark = pytest.mark.integration

ISOLATION_REPRO = textwrap.dedent('''
    """ISO1: what a rank of this cell imports, and from where."""
    from repros.runtime.spec import Expectation, ReproSpec

    SPEC = ReproSpec(
        id="ISO1",
        title="a rank imports its cell's packages only",
        upstream=(),
        signatures=(),
        modes=("bug",),
        world_size=1,
        expectations=(Expectation("bug", "NOT_REPRODUCED"),),
    )


    def run(ctx):
        import importlib.util
        import sys

        import numpy

        problems = []
        if numpy.__version__ != "1.26.4":
            problems.append(f"numpy {numpy.__version__} from {numpy.__file__}")
        if importlib.util.find_spec("harness") is not None:
            problems.append("the orchestrator's own package is importable")
        # Packages both sides have (the orchestrator's rich, jinja2, yaml...) come from the cell.
        for name in ("numpy", "jinja2", "rich", "yaml", "packaging"):
            spec = importlib.util.find_spec(name)
            if spec is not None and not str(spec.origin).startswith(sys.prefix):
                problems.append(f"{name} from outside the cell: {spec.origin}")
        if problems:
            raise AssertionError("; ".join(problems))
''')


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment outside the repository with the harness installed from its wheel."""
    work = tmp_path_factory.mktemp("installed")
    wheels = work / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(wheels), str(REPO_ROOT)],
        check=True,
        capture_output=True,
        text=True,
    )
    (wheel,) = wheels.glob("ft_regress-*.whl")
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(wheel)],
        check=True,
        capture_output=True,
        text=True,
    )
    return venv


def test_a_cell_imports_its_own_packages_not_the_installed_orchestrators(installed: Path, tmp_path: Path) -> None:
    orchestrator_numpy = subprocess.run(
        [str(installed / "bin" / "python"), "-c", "import numpy; print(numpy.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert orchestrator_numpy.startswith("2."), orchestrator_numpy  # the trap: another numpy beside the harness
    shipped = yaml.safe_load((REPO_ROOT / "matrix.yaml").read_text())
    matrix = {
        "version": 1,
        "lanes": {"iso": "isolation"},
        "defaults": shipped["defaults"],
        "cells": {"pinned-numpy": {"packages": {"numpy": "==1.26.4"}, "lanes": ["iso"]}},
    }
    (tmp_path / "matrix.yaml").write_text(yaml.safe_dump(matrix))
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "iso1.py").write_text(ISOLATION_REPRO)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    done = subprocess.run(
        [
            str(installed / "bin" / "ft-regress"),
            "run",
            "--lane",
            "iso",
            "--repros-dir",
            "mine",
            "--repros",
            "ISO1",
            "--out",
            "out",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    records = results_json(tmp_path / "out" / "results.jsonl")
    assert len(records) == 1, done.stdout + done.stderr
    record = records[0]
    assert record["outcome"] == "NOT_REPRODUCED", (record.get("error"), record.get("ranks"), done.stdout[-3000:])
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_users_plain_script_is_explored_saved_bisected_and_explained_from_the_installed_wheel(
    installed: Path, tmp_path: Path
) -> None:
    """The user this serves: `pip install`, `init`, then their script across two cells, outside the repo."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("VIRTUAL_ENV", "PYTHONPATH", "FT_REGRESS_MATRIX", "FT_REGRESS_REPROS")
    }
    project = tmp_path / "my-job"

    def ft(*args: str, timeout: int = 1800) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(installed / "bin" / "ft-regress"), *args],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    project.mkdir()
    assert ft("init").returncode == 0
    explored = ft("run", "--save-expectations", "--out", "explored")
    assert explored.returncode == 0, explored.stdout + explored.stderr
    records = {(r["cell"], r["mode"]): r for r in results_json(project / "explored" / "results.jsonl")}
    assert {k: r["outcome"] for k, r in records.items()} == {
        ("current", "bug"): "NOT_REPRODUCED",
        ("current", "fixed"): "PASS",
        ("ds-0.19.2", "bug"): "REPRODUCED",
        ("ds-0.19.2", "fixed"): "PASS",
    }, explored.stdout
    assert records[("ds-0.19.2", "bug")]["error"]["type"] == "torch.utils.checkpoint.CheckpointError"
    assert records[("ds-0.19.2", "bug")]["repro_cmd"].startswith(f"ft-regress run --matrix {project / 'matrix.yaml'}")
    assert "fails as declared in ds-0.19.2 (deepspeed 0.19.2)" in explored.stdout
    saved = yaml.safe_load((project / "repro.yaml").read_text())["repro"]["expectations"]
    assert {(e["mode"], e["outcome"], tuple(e.get("when", {}).items())) for e in saved} == {
        ("bug", "NOT_REPRODUCED", (("deepspeed", "==0.19.8"),)),
        ("bug", "REPRODUCED", (("deepspeed", "==0.19.2"),)),
        ("fixed", "PASS", (("deepspeed", "==0.19.8"),)),
        ("fixed", "PASS", (("deepspeed", "==0.19.2"),)),
    }
    checked = ft("run", "--cells", "ds-0.19.2", "--modes", "bug", "--out", "checked")
    assert checked.returncode == 0 and "1 of 1 items matched their expectation" in checked.stdout, checked.stdout

    bisected = ft(
        "bisect",
        "--repro",
        "my-training",
        "--package",
        "deepspeed",
        "--good",
        "0.19.3",
        "--bad",
        "0.19.2",
        "--out",
        "bisect",
    )
    assert bisected.returncode == 0, bisected.stdout + bisected.stderr
    assert bisected.stdout.strip().splitlines()[-1] == "first good: deepspeed==0.19.3"

    explained = ft("explain", "explored/items/ds-0.19.2/my-training-bug/rank0.log", timeout=300)
    assert explained.returncode == 0, explained.stdout + explained.stderr
    assert explained.stdout.startswith("F1: LoRA + gradient checkpointing + ZeRO-3: recomputed shape [0]")
    assert "affected: deepspeed<0.19.3 (REPRODUCED)" in explained.stdout
    assert "my-training: LoRA + ZeRO-3 + gradient checkpointing fails in backward - your repro" in explained.stdout
