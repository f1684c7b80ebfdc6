"""``check`` reads the running interpreter's own stack: where that interpreter has no torch there is
nothing to check, which is one line naming the interpreter and the fix, exit 2; where nothing selected could
run there (a torch alone), the check does not pass (exit 2, saying why); a world size that launches no rank is
refused; and the world size follows the GPUs it sees."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from harness.cli.commands.check import default_world_size
from harness.core.errors import EXIT_NOTHING_CHECKED


def test_an_interpreter_without_torch_is_a_usage_error(tmp_path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "harness", "check", "--out", str(tmp_path / "out")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    said = (done.stdout + done.stderr).strip().splitlines()
    assert len(said) == 1 and sys.executable in said[0] and "torch" in said[0]
    assert "install ft-regress into the environment that holds your torch stack" in said[0]
    assert not (tmp_path / "out").exists()


def test_one_rank_per_gpu_two_at_most_and_two_cpu_ranks_without_one() -> None:
    assert default_world_size([]) == 2
    assert default_world_size(["0"]) == 1
    assert default_world_size(["0", "1", "2", "3"]) == 2


def _torch_alone(tmp_path: Path) -> Path:
    """An interpreter whose stack is a torch that does not import (all a runner has is torch, and not even that
    works), with the harness beside it as a runner installs it."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import site; print(site.getsitepackages()[0])"], capture_output=True, text=True, check=True
    ).stdout.strip()
    (Path(site) / "torch").mkdir()
    (Path(site) / "torch" / "__init__.py").write_text('raise ImportError("this torch was built for another CPU")\n')
    info = Path(site) / "torch-2.13.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0\n")
    (info / "top_level.txt").write_text("torch\n")
    orchestrator = sysconfig.get_paths()["purelib"]
    (Path(site) / "zz-orchestrator.pth").write_text(f"import site; site.addsitedir({orchestrator!r})\n")
    return python


def test_a_check_that_could_run_nothing_does_not_pass(tmp_path: Path) -> None:
    python = _torch_alone(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH") and "FT_REGRESS" not in k}
    done = subprocess.run(
        [str(python), "-m", "harness", "check", "--repros", "F1,F8", "--out", str(tmp_path / "out")],
        cwd=tmp_path,
        env={**env, "FT_REGRESS_CACHE": str(tmp_path / "cache")},
        capture_output=True,
        text=True,
        timeout=600,
    )
    said = done.stdout + done.stderr
    assert done.returncode == EXIT_NOTHING_CHECKED, said[-3000:]
    assert "nothing could be checked: none of the 2 documented failures selected could run here" in said
    assert "F1   cannot run here: INFRA" in said and "this stack has none" not in said


@pytest.mark.parametrize("size", ["0", "-1"])
def test_a_world_size_that_launches_no_rank_is_refused(tmp_path: Path, size: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "harness", "check", "--world-size", size, "--out", str(tmp_path / "out")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--world-size takes a whole number (1 or more)" in done.stderr and not (tmp_path / "out").exists()
