"""``check`` reads the running interpreter's own stack: where that interpreter has no torch there is
nothing to check, which is one line naming the interpreter and the fix, exit 2; and the world size
follows the GPUs it sees."""

from __future__ import annotations

import subprocess
import sys

from harness.cli.commands.check import default_world_size


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
