"""The fault suite: real ranks that crash, hang, flood their logs, raise markup, or
fail to import, and a run interrupted by SIGTERM and resumed. Nothing may be lost and
nothing may be left running.

The faults run in a cell with the shipped defaults' packages (the ci lane's
environment, reused from the cache).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.support.paths import REPO_ROOT, results_json

pytestmark = pytest.mark.integration

FAULTS = REPO_ROOT / "tests" / "support" / "fault_repros"
# Generous: with pytest-xdist two integration files share the two cores. Only the HANG
# item waits this long.
TIMEOUT_S = 60
# The interrupt's run: only FAULT-NOISY (a few seconds) must end within it; the HANG item, run
# again by --resume, waits it out.
INTERRUPT_TIMEOUT_S = 30


def fault_matrix(tmp: Path, timeout_s: float = TIMEOUT_S) -> Path:
    shipped = yaml.safe_load((REPO_ROOT / "matrix.yaml").read_text())
    matrix = {
        "version": 1,
        "defaults": {**shipped["defaults"], "timeout_s": timeout_s},
        "lanes": {"faults": "the fault suite"},
        "cells": {"faults": {"lanes": ["faults"]}},
    }
    path = tmp / "faults.yaml"
    path.write_text(yaml.safe_dump(matrix))
    return path


def harness(matrix: Path, out: Path, repros: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "harness",
        "run",
        "--matrix",
        str(matrix),
        "--lane",
        "faults",
        "--repros-dir",
        str(FAULTS),
        "--repros",
        repros,
        "--out",
        str(out),
    ]


def leftovers(marker: str) -> list[str]:
    """Processes whose command line mentions ``marker``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().split()[2]
        except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError):
            continue
        if marker in cmdline and state != "Z":
            found.append(f"{proc.name}: {cmdline[:160]}")
    return found


@pytest.fixture(scope="module")
def fault_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, dict], Path, str]:
    work = tmp_path_factory.mktemp("faults")
    out = work / "out"
    proc = subprocess.run(
        harness(
            fault_matrix(work),
            out,
            "FAULT-SIGKILL,FAULT-HANG,FAULT-NOISY,FAULT-MARKUP,fault_import,FAULT-TOLD-ONE,FAULT-RUNAWAY",
        ),
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=1800,
    )
    records = {r["repro"]: r for r in results_json(out / "results.jsonl")}
    return proc.returncode, records, out, proc.stdout + proc.stderr


def test_every_fault_is_recorded_and_the_run_goes_on(fault_run) -> None:
    code, records, _, log = fault_run
    assert code == 1  # the broken import has no expectation to match
    assert {r: records[r]["outcome"] for r in records} == {
        "FAULT-SIGKILL": "CRASH",
        "FAULT-HANG": "HANG",
        "FAULT-NOISY": "NOT_REPRODUCED",
        "FAULT-MARKUP": "DIFFERENT_ERROR",
        "fault_import": "INFRA",
        "FAULT-TOLD-ONE": "NOT_REPRODUCED",
        "FAULT-RUNAWAY": "INFRA",
    }, log


def test_ranks_told_another_world_by_their_script_are_recorded_as_they_ran(fault_run) -> None:
    _, records, _, _ = fault_run
    told = records["FAULT-TOLD-ONE"]
    assert told["world_size"] == 1 and told["world_size_launched"] == 2, told
    assert [r.get("ran_as_rank") for r in told["ranks"]] == [None, 0]
    assert any("ran as a world of 1" in r and "launched as 2" in r for r in told["reasons"])


def test_a_runaway_signature_pattern_is_named_never_a_hang(fault_run) -> None:
    _, records, _, _ = fault_run
    runaway = records["FAULT-RUNAWAY"]
    assert runaway["error"]["type"] == "ValueError" and runaway["wall_s"] < TIMEOUT_S / 2, runaway
    assert "FAULT-RUNAWAY.declared" in runaway["reasons"][0] and "a runaway pattern" in runaway["reasons"][0]


def test_a_killed_rank_is_named_with_its_signal(fault_run) -> None:
    _, records, _, _ = fault_run
    reason = records["FAULT-SIGKILL"]["reasons"][0]
    assert "rank 1" in reason and "SIGKILL" in reason


def test_a_hang_ends_within_the_timeout_with_every_ranks_stack(fault_run) -> None:
    _, records, _, _ = fault_run
    hang = records["FAULT-HANG"]
    assert hang["wall_s"] < TIMEOUT_S + 15
    for rank in hang["ranks"]:
        assert "most recent call first" in rank["log_tail"], rank["log_tail"][-800:]
    assert (
        "all_reduce" in hang["ranks"][1]["log_tail"] or "all_reduce" in Path(hang["item_dir"], "rank1.log").read_text()
    )


def test_no_process_is_left_behind(fault_run) -> None:
    _, _, out, _ = fault_run
    time.sleep(1)
    assert leftovers(str(out)) == []
    assert leftovers("fault-hang-worker") == []


def test_a_flood_of_output_is_kept_on_disk_and_bounded_in_the_record(fault_run) -> None:
    _, records, _, _ = fault_run
    noisy = records["FAULT-NOISY"]
    tails = [r["log_tail"] for r in noisy["ranks"]]
    assert all(len(t) <= 4100 and "the last line of the noise" in t for t in tails)
    assert Path(noisy["item_dir"], "rank0.log").stat().st_size > 3_000_000  # the whole flood, on disk
    assert len(json.dumps(noisy)) < 64 * 1024


def test_markup_in_a_message_is_shown_as_text(fault_run) -> None:
    _, records, _, log = fault_run
    marked = records["FAULT-MARKUP"]
    assert marked["error"]["message"].startswith("<script>alert('x')</script> [bold red]not markup[/bold red]")
    assert "[bold red]not markup[/bold red]" in log  # printed literally, not interpreted by rich


def test_a_broken_repro_file_is_infra_with_its_import_error(fault_run) -> None:
    _, records, _, _ = fault_run
    broken = records["fault_import"]
    assert "ImportError" in broken["reasons"][0] and "broken on purpose" in broken["reasons"][0]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_an_interrupt_keeps_what_finished_and_resume_runs_only_the_rest(tmp_path: Path, signum: int) -> None:
    out = tmp_path / "out"
    proc = subprocess.Popen(
        harness(fault_matrix(tmp_path, INTERRUPT_TIMEOUT_S), out, "FAULT-NOISY,FAULT-HANG"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO_ROOT,
    )
    results = out / "results.jsonl"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and not (results.exists() and results.read_text().count("\n") >= 1):
        time.sleep(0.5)
    time.sleep(3)  # into the hanging item
    proc.send_signal(signum)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, output
    assert "resume with" in output and "FAULT-NOISY" in output  # the summary of what finished
    first = results_json(results)
    assert [r["repro"] for r in first] == ["FAULT-NOISY"]
    assert all(line.endswith("}") for line in results.read_text().splitlines())  # no torn line
    assert json.loads((out / "run.json").read_text())["interrupted"] == signal.Signals(signum).name
    time.sleep(1)
    assert leftovers(str(out)) == []

    resumed = subprocess.run(
        [sys.executable, "-m", "harness", "run", "--resume", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "1 items already done" in resumed.stdout
    final = results_json(results)
    assert sorted(r["repro"] for r in final) == ["FAULT-HANG", "FAULT-NOISY"]
    assert final[0] == first[0]


def test_a_repro_that_edits_site_packages_is_infra_and_the_next_item_gets_a_rebuilt_cell(tmp_path: Path) -> None:
    # A cell of its own (a date cut-off in the far future resolves the same packages under another
    # key), so that no other test's items share the environment this one damages.
    matrix_path = fault_matrix(tmp_path)
    matrix = yaml.safe_load(matrix_path.read_text())
    matrix["cells"]["faults"]["exclude_newer"] = "2999-01-01T00:00:00Z"
    matrix_path.write_text(yaml.safe_dump(matrix))
    out = tmp_path / "out"
    proc = subprocess.run(
        harness(matrix_path, out, "FAULT-DAMAGE,FAULT-NOISY"),
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=3000,
    )
    log = proc.stdout + proc.stderr
    records = {r["repro"]: r for r in results_json(out / "results.jsonl")}
    damage = records["FAULT-DAMAGE"]
    assert damage["outcome"] == "INFRA" and damage["matched"], log
    assert (
        "changed while the item ran" in damage["reasons"][0] and "peft/__init__.py was modified" in damage["reasons"][0]
    )
    after = records["FAULT-NOISY"]
    assert after["outcome"] == "NOT_REPRODUCED" and "rebuilt" in after["environment_repaired"], log
    # The edit reached neither the rebuilt environment nor uv's cache it was copied from.
    peft_init = next(Path(after["env"]["path"]).glob("venv/lib/python*/site-packages/peft/__init__.py"))
    assert "edited by FAULT-DAMAGE" not in peft_init.read_text()
    assert proc.returncode == 0, log
