"""``atlas check --prove`` end to end on the stand-in stack: a failure nothing was proven about is unknown; proving
it runs it in the stack (here the running interpreter, a passthrough cell), answers from what the run saw, and the
atlas keeps that evidence for the next check."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from harness.analysis.atlas.model import read_atlas
from harness.core.errors import EXIT_NOTHING_CHECKED
from tests.support import fake_stack
from tests.support.paths import REPO_ROOT


def atlas_check(root: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness", "atlas", "check", "--here", "--repros", "R1", "--atlas", str(root / "atlas")]
        + ["--repros-dir", str(root / "repros"), "--reports-dir", str(root / "reports"), *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_prove_runs_what_is_unknown_answers_from_it_and_keeps_it(tmp_path: Path) -> None:
    env = fake_stack.run_env(fake_stack.install(tmp_path))
    # R1 declares it reproduces, but records no stack it was established on: nothing is proven about any stack.
    fake_stack.write_repro(tmp_path / "repros", "R1", "raise", "REPRODUCED")
    before = atlas_check(tmp_path, env)
    assert before.returncode == EXIT_NOTHING_CHECKED and "nothing was answered" in before.stderr, (
        before.stdout + before.stderr
    )
    assert before.stdout.startswith("R1 unknown: ") and "--here --prove --repros R1" in before.stdout

    proved = atlas_check(tmp_path, env, "--prove")
    assert proved.returncode == 1, proved.stdout + proved.stderr
    (line,) = proved.stdout.splitlines()
    assert line.startswith("R1 affected: REPRODUCED observed on this stack (cpu, 2 ranks, qwen2)")
    atlas = read_atlas(tmp_path / "atlas" / "atlas.json")
    (run,) = (tmp_path / "atlas" / "runs").iterdir()
    assert str(run) in atlas.sources and (run / "results.jsonl").is_file()
    (stack,) = (tmp_path / "atlas" / "stacks").glob("*.yaml")
    assert "provider: passthrough" in stack.read_text()  # --here: the interpreter as it is, nothing built
    entry = atlas.failure("R1")
    assert entry is not None and any(c.source == "run" and c.outcome == "REPRODUCED" for c in entry.claims)

    # The next check, proving nothing, answers from the evidence the atlas kept.
    again = atlas_check(tmp_path, env)
    assert again.returncode == 1 and again.stdout.startswith("R1 affected: "), again.stdout + again.stderr
