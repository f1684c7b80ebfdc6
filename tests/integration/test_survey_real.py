"""``atlas survey`` for real, on a survey of its own: a stack of 2026-11's releases (pinned, as a lock gives them),
built by the harness's provider with everything else resolved as of its day; F1, which the catalog proved under
transformers 5.23.0 and 4.57.6 only, asked of it with transformers 5.22.0. The survey runs it, the atlas answers
from the run, and a second survey finds nothing left to run. ``atlas check --requirements --as-of``
resolves a real range as of a day."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.analysis.atlas.model import read_atlas
from tests.support.paths import REPO_ROOT

pytestmark = pytest.mark.integration

STACK = {"torch": "2.13.0", "deepspeed": "0.19.5", "peft": "0.21.2", "transformers": "5.22.0", "accelerate": "1.15.0"}


def harness(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )


def test_a_survey_runs_what_the_atlas_cannot_answer_and_resumes_with_nothing_left(tmp_path: Path) -> None:
    survey = tmp_path / "survey.yaml"
    survey.write_text(
        yaml.safe_dump(
            {
                "version": 1,
                "stacks": [
                    {
                        "id": "ours",
                        "kind": "release",
                        "title": "our training stack of November 2026",
                        "source": {"repository": "us/train", "ref": "v1", "file": "uv.lock", "date": "2026-11-20"},
                        "requires": [f"{k}=={v}" for k, v in STACK.items()],
                        "stack": STACK,
                    }
                ],
            }
        )
    )
    out = tmp_path / "out"
    first = harness("atlas", "survey", "--survey", str(survey), "--repros", "F1", "--out", str(out))
    assert first.returncode == 0, first.stdout + first.stderr
    assert "1 environments to build and run" in first.stderr and "runs F1" in first.stderr
    assert "ours: 0 affected (-), 1 not affected, 0 unknown" in first.stderr
    (run,) = (out / "runs").iterdir()
    assert str(run) in read_atlas(out / "atlas.json").sources
    (cell,) = (out / "stacks").glob("*.yaml")
    assert "exclude_newer: '2026-11-20'" in cell.read_text()  # everything else as of the stack's day

    again = harness("atlas", "survey", "--survey", str(survey), "--repros", "F1", "--out", str(out))
    assert again.returncode == 0 and "0 environments to build and run" in again.stderr, again.stderr
    assert len(list((out / "runs").iterdir())) == 1

    check = harness(
        "atlas", "check", "--stack", " ".join(f"{k}=={v}" for k, v in STACK.items()), "--repros", "F1",
        "--atlas", str(out), "--device", "cpu",
    )  # fmt: skip
    assert check.returncode == 0 and check.stdout.startswith("F1 not affected: "), check.stdout + check.stderr


def test_a_range_resolves_as_of_its_day(tmp_path: Path) -> None:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("transformers>=4.41.2,<=4.46.1\npeft>=0.11.1,<=0.12.0\ndeepspeed>=0.10.0,<=0.14.4\n")
    done = harness("atlas", "check", "--requirements", str(requirements), "--as-of", "2024-11-25", "--repros", "F8")
    # The catalog proves F8 from torch 2.4.0 (the survey's runs) to 2.13.0: 2.5.1 is affected, and the check fails.
    assert done.returncode == 1 and done.stdout.startswith("F8 affected: "), done.stdout + done.stderr
    said = done.stderr.splitlines()[0]
    assert said.startswith(f"{requirements} as of 2024-11-25: ")
    # LLaMA-Factory v0.9.1's lines as of its release: the torch accelerate needed that day, the newest in range.
    for pin in ("torch==2.5.1", "deepspeed==0.14.4", "transformers==4.46.1", "peft==0.12.0"):
        assert pin in said, said
