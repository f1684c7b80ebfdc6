"""`watch` for real on CPU: a floating cell's F9 outcome changes between two nights, and the
watch names peft 0.15.1 (uploaded 2025-03-27, together with a new pydantic) as the release
that changed it: once by bisecting the days between the nights, once as an upgrade question
(`--pin`) against the same previous night.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO_ROOT

pytestmark = pytest.mark.integration

# peft floats over 0.15.x; everything else of the stack is pinned, so the nights differ by
# peft and its own dependencies only (and by whatever else PyPI released those days).
MATRIX = """\
version: 1
default_lane: watched
lanes: {watched: "a floating peft"}
defaults:
  world_size: 2
  python: "3.11"
  timeout_s: 600
  packages: {torch: "==2.13.0", deepspeed: "==0.19.8", transformers: "==4.57.6",
             accelerate: "==1.5.2", bitsandbytes: "==0.50.2"}
cells:
  peft-floats:
    packages: {peft: ">=0.15.0,<0.16"}
    repros: [F9]
    lanes: [watched]
"""


def harness(*args: str | Path, timeout: int = 1500) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def first_night(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The night of 2025-03-25 (peft 0.15.0 was the newest): F9 reproduces."""
    root = tmp_path_factory.mktemp("watch")
    matrix = root / "matrix.yaml"
    matrix.write_text(MATRIX)
    night = root / "night-2025-03-25"
    proc = harness("run", "--matrix", matrix, "--modes", "bug", "--as-of", "2025-03-25", "--out", night)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    meta = json.loads((night / "run.json").read_text())
    cell = meta["cells"]["peft-floats"]
    assert cell["floating"] == ["peft"] and cell["packages"]["peft"] == "0.15.0", cell
    assert cell["resolution"]["as_of"] == "2025-03-25"
    return matrix, night


def changes_of(run_dir: Path) -> list[dict[str, object]]:
    changes = json.loads((run_dir / "changes.json").read_text())
    assert isinstance(changes, list)
    return changes


def test_the_day_and_the_release_that_fixed_f9_are_named(first_night: tuple[Path, Path]) -> None:
    matrix, previous = first_night
    tonight = previous.parent / "night-2025-03-28"
    summary = previous.parent / "summary.md"
    proc = harness(
        "watch", "--matrix", matrix, "--modes", "bug", "--as-of", "2025-03-28",
        "--previous", previous, "--out", tonight, "--no-update-expectations", "--markdown", summary,
    )  # fmt: skip
    log = proc.stdout + proc.stderr
    # A fix upstream is news, not a failure of the night: the watch exits 0.
    assert proc.returncode == 0, log
    [change] = changes_of(tonight)
    assert (change["cell"], change["repro"], change["mode"]) == ("peft-floats", "F9", "bug")
    assert (change["before"], change["after"]) == ("REPRODUCED", "NOT_REPRODUCED")
    assert change["verdict"] == "fixed-upstream", log
    assert change["culprit"] == {"package": "peft", "last": "0.15.0", "first": "0.15.1"}, log
    evidence = change["evidence"]
    assert isinstance(evidence, dict)
    # Several packages moved that day; peft moved alone over the day before shows the change.
    assert evidence["day"] == "2025-03-27"
    assert "peft" in evidence["moved_that_day"] and len(evidence["moved_that_day"]) > 1
    assert evidence["alone"] == {"peft": "NOT_REPRODUCED"}
    bisect = json.loads((Path(evidence["bisect"]) / "bisect.json").read_text())
    assert bisect["boundary"] == "2025-03-27"
    # The summary for the job page names the culprit, and the command to take the new outcome.
    text = summary.read_text()
    assert "**fixed-upstream**" in text and "peft 0.15.0 → 0.15.1" in text
    assert "--as-of 2025-03-28 --save-expectations" in str(change["update_command"])


def test_an_upgrade_question_bisects_the_one_package_pinned(first_night: tuple[Path, Path]) -> None:
    matrix, previous = first_night
    upgraded = previous.parent / "peft-0.15.1"
    proc = harness(
        "watch", "--matrix", matrix, "--modes", "bug", "--as-of", "2025-03-25",
        "--previous", previous, "--pin", "peft==0.15.1", "--out", upgraded, "--no-update-expectations",
    )  # fmt: skip
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    [change] = changes_of(upgraded)
    # Only the pinned package moved (the day is the same), so the release bisect names it.
    assert change["moved"] == {"peft": ["0.15.0", "0.15.1"]}, log
    assert change["previous_cell"] == "peft-floats"
    assert change["verdict"] == "fixed-upstream"
    assert change["culprit"] == {"package": "peft", "last": "0.15.0", "first": "0.15.1"}
    assert "bisecting its 2 releases" in log
