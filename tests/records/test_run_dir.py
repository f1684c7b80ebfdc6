"""A run directory holds one run: locked while it is written, refused to a second writer,
and never left with a torn record or a run.json that says less than what happened."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.records.results import read_results
from tests.support import fake_stack
from tests.support.paths import REPO_ROOT


def make_stack(tmp_path: Path, slow_s: float, behaviour: str = "clean") -> tuple[Path, dict[str, str]]:
    """Three stand-in repros in one cell, the middle one taking ``slow_s``."""
    env = fake_stack.run_env(fake_stack.install(tmp_path))
    fake_stack.write_repro(tmp_path / "repros", "S1", behaviour, "NOT_REPRODUCED", sleep=0.0)
    fake_stack.write_repro(tmp_path / "repros", "S2", behaviour, "NOT_REPRODUCED", sleep=slow_s)
    fake_stack.write_repro(tmp_path / "repros", "S3", behaviour, "NOT_REPRODUCED", sleep=0.0)
    fake_stack.write_matrix(tmp_path / "matrix.yaml", ["a"])
    return tmp_path, env


@pytest.fixture()
def stack(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    return make_stack(tmp_path, slow_s=0.0)


@pytest.fixture()
def chatty_stack(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    # Each rank prints ~6 KB, so a record (with its log tails) is several times the size of run.json.
    return make_stack(tmp_path, slow_s=0.0, behaviour="chatty")


@pytest.fixture()
def slow_stack(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    # Long enough that the other commands, each reading the repros first, start while it runs.
    return make_stack(tmp_path, slow_s=20.0)


def harness(root: Path, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "harness",
        "run",
        "--matrix",
        str(root / "matrix.yaml"),
        "--repros-dir",
        str(root / "repros"),
        "--repros",
        "S1,S2,S3",
        *args,
    ]


def wait_for(path: Path, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)


def test_a_live_run_cannot_be_resumed_or_written_by_another(slow_stack) -> None:
    root, env = slow_stack
    out = root / "out"
    first = subprocess.Popen(
        harness(root, "--out", str(out)),
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(out / "items" / "a" / "S2-bug" / "rank0.json")
    resume = subprocess.run(
        [sys.executable, "-m", "harness", "run", "--resume", str(out)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    second = subprocess.run(harness(root, "--out", str(out)), cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    stdout, stderr = first.communicate(timeout=120)
    assert first.returncode == 0, stdout + stderr
    assert resume.returncode == 2 and "in use by a live run" in resume.stderr
    assert second.returncode == 2 and ("in use by a live run" in second.stderr or "already holds" in second.stderr)
    records = read_results(out / "results.jsonl")
    assert sorted(r.repro for r in records) == ["S1", "S2", "S3"]  # each once: nothing ran twice


def test_a_full_disk_ends_the_run_cleanly_keeping_whole_records(chatty_stack) -> None:
    root, env = chatty_stack
    out = root / "out"
    out.mkdir()
    # A file-size limit stands in for a full disk: a write past it fails (EFBIG) after a partial write.
    # Room for two records, not three (a record is ~6.5 KB with its log tails here), and for run.json
    # (~5 KB, more with a long temporary path and the write error it must record).
    limit = 16000

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    done = subprocess.run(
        harness(root, "--out", str(out)),
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        preexec_fn=limited,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "could not write a record" in done.stdout and "run --resume" in done.stdout
    text = (out / "results.jsonl").read_text()
    kept = read_results(out / "results.jsonl")
    assert text.endswith("\n") and 1 <= len(kept) < 3  # every line whole, none torn
    assert not (out / "results.jsonl.torn").exists()
    meta = json.loads((out / "run.json").read_text())
    assert "could not write a record" in meta["write_error"] and meta["finished_at"]
    # Room again: the resume runs what is missing and appends cleanly.
    again = subprocess.run(
        [sys.executable, "-m", "harness", "run", "--resume", str(out)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert sorted(r.repro for r in read_results(out / "results.jsonl")) == ["S1", "S2", "S3"]
