"""The repros as pytest items, end to end: an inner pytest session (with and without
xdist) over stand-in repros run by a stand-in torchrun (tests/fake_stack.py) under
the real orchestrator. Items must give the records `python -m harness run` gives, fail
with a readable message, lease disjoint GPUs under xdist, and never be collected
unless asked for."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
from junitparser import JUnitXml

from harness.records.item import ItemRecord
from harness.records.results import read_results
from tests.support import fake_stack
from tests.support.paths import REPO_ROOT

OBSERVED = (
    "cell",
    "repro",
    "mode",
    "outcome",
    "signature",
    "expected",
    "matched",
    "versions",
    "world_size",
    "error",
    "reasons",
    "repro_cmd",
)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("pytest-plugin")
    env = fake_stack.run_env(fake_stack.install(root))
    env["FT_REGRESS_GPU_LOCK_DIR"] = str(root / "gpu-locks")
    env["FT_REGRESS_CACHE"] = str(root / "cache")
    repros = root / "repros"
    fake_stack.write_repro(repros, "T1", "raise", "REPRODUCED", sleep=1.5)
    fake_stack.write_repro(repros, "T2", "clean", "NOT_REPRODUCED", world_size=1, sleep=0.5)
    fake_stack.write_repro(repros, "T3", "other", "REPRODUCED", sleep=0.5)  # DIFFERENT_ERROR
    fake_stack.write_repro(repros, "T4", "clean", "NOT_REPRODUCED", world_size=5)
    (repros / "t9_broken.py").write_text("raise ImportError('no such thing')\nSPEC = None  # declared, never reached\n")
    fake_stack.write_matrix(
        root / "matrix.yaml", ["a", "b"], extra={"exclude": [{"cell": "b", "repro": "T2", "reason": "not here"}]}
    )
    return root, env


def pytest_run(
    stack: tuple[Path, dict[str, str]], *args: str, env: dict[str, str] | None = None, repros: str = "T1,T2,T3"
) -> subprocess.CompletedProcess[str]:
    root, base = stack
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-q",
        "-rs",
        f"--matrix={root / 'matrix.yaml'}",
        f"--repros-dir={root / 'repros'}",
        *args,
    ]
    if repros:
        command.append(f"--repros={repros}")
    return subprocess.run(
        command, capture_output=True, text=True, cwd=REPO_ROOT, env={**base, **(env or {})}, timeout=300
    )


def observed(records: list[ItemRecord]) -> list[dict[str, Any]]:
    return sorted(
        ({k: getattr(r, k) for k in OBSERVED} for r in records), key=lambda r: (r["cell"], r["repro"], r["mode"])
    )


def test_items_have_readable_ids_and_excluded_items_are_listed(stack: tuple[Path, dict[str, str]]) -> None:
    proc = pytest_run(stack, "--co")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ids = [line.split("::")[-1] for line in proc.stdout.splitlines() if "::" in line]
    assert ids == ["T1-bug[a]", "T1-bug[b]", "T2-bug[a]", "T2-bug[b]", "T3-bug[a]", "T3-bug[b]"], proc.stdout


def test_the_harness_tests_never_collect_repro_items() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=300,
    )
    nodeids = [line for line in proc.stdout.splitlines() if "::" in line]
    assert nodeids and all(n.startswith("tests/") for n in nodeids), proc.stdout[-2000:]


def test_a_bad_lane_is_a_usage_error_naming_the_lane(stack: tuple[Path, dict[str, str]]) -> None:
    proc = pytest_run(stack, "--lane=nope", "--co")
    assert proc.returncode == 4 and "no lane named 'nope'" in proc.stderr


def test_items_under_xdist_record_what_run_records(stack: tuple[Path, dict[str, str]]) -> None:
    root, base = stack
    out = root / "pytest-out"
    proc = pytest_run(stack, "-n", "2", f"--repro-out={out}", f"--junitxml={root / 'junit.xml'}")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "2 failed, 3 passed, 1 skipped" in proc.stdout, proc.stdout
    assert "excluded: not here" in proc.stdout
    # the failure shows the outcome against the expectation, the error, each rank's tail, the rerun
    assert "a/T3/bug: observed DIFFERENT_ERROR, expected REPRODUCED" in proc.stdout
    assert "error: KeyError: 'something else' (rank 0)" in proc.stdout
    assert "rank 1 (error, exit code 1) log tail:" in proc.stdout
    assert "rerun: pytest " in proc.stdout and "::T3-bug[a]' --matrix " in proc.stdout

    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "run",
            f"--matrix={root / 'matrix.yaml'}",
            f"--repros-dir={root / 'repros'}",
            "--repros=T1,T2,T3",
            "--out",
            str(root / "run-out"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=base,
        timeout=300,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert observed(read_results(out / "results.jsonl")) == observed(read_results(root / "run-out" / "results.jsonl"))

    suite = next(iter(JUnitXml.fromfile(str(root / "junit.xml"))))
    cases = {c.name: c for c in suite}
    assert set(cases) == {"T1-bug[a]", "T1-bug[b]", "T2-bug[a]", "T2-bug[b]", "T3-bug[a]", "T3-bug[b]"}
    workers: dict[str, set[str]] = {}
    for case in ElementTree.parse(root / "junit.xml").iter("testcase"):
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        if "xdist_worker" in props:
            workers.setdefault(case.get("name", "").split("[")[1], set()).add(props["xdist_worker"])
    assert workers.keys() == {"a]", "b]"} and all(len(w) == 1 for w in workers.values()), workers  # one group a cell
    failed = [c for c in cases.values() if not c.is_passed and not c.is_skipped]
    assert len(failed) == 2 and "observed DIFFERENT_ERROR" in failed[0].result[0].message
    # the harness's own run directory, readable by report and compare
    meta = json.loads((out / "run.json").read_text())
    assert meta["via"] == "pytest" and meta["finished_at"]
    assert next(iter(JUnitXml.fromfile(str(out / "junit.xml")))).tests == 6
    report = subprocess.run(
        [sys.executable, "-m", "harness", "compare", str(root / "run-out"), str(out)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=base,
        timeout=120,
    )
    assert report.returncode == 0, report.stdout + report.stderr


def test_a_broken_repro_file_fails_as_infra(stack: tuple[Path, dict[str, str]]) -> None:
    root, _ = stack
    proc = pytest_run(stack, f"--repro-out={root / 'broken-out'}", "--cell=a", repros="t9_broken")
    assert proc.returncode == 1 and "1 failed" in proc.stdout, proc.stdout
    assert "a/t9_broken/bug: observed INFRA" in proc.stdout and "ImportError: no such thing" in proc.stdout


def test_xdist_workers_lease_disjoint_gpus_sized_to_each_item(stack: tuple[Path, dict[str, str]]) -> None:
    root, _ = stack
    out = root / "gpu-out"
    proc = pytest_run(
        stack, "-n", "2", f"--repro-out={out}", env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, repros="T1,T2,T4"
    )
    assert "needs 5 GPUs, 4 visible" in proc.stdout, proc.stdout  # T4 wants 5 ranks
    assert "3 passed, 3 skipped" in proc.stdout, proc.stdout  # T2 in b is excluded
    spans = []
    for record in read_results(out / "results.jsonl"):
        assert record.item_dir is not None
        ranks = [json.loads(p.read_text()) for p in sorted(Path(record.item_dir).glob("rank*.json"))]
        devices = {r["visible_devices"] for r in ranks}
        assert len(devices) == 1, devices  # every rank of an item sees the same lease
        leased = devices.pop().split(",")
        assert len(leased) == record.world_size == len(record.gpus_leased)
        spans.append((min(r["t_start"] for r in ranks), max(r["t_end"] for r in ranks), set(leased)))
    assert len(spans) == 3
    overlapping = 0
    for i, (s1, e1, g1) in enumerate(spans):
        for s2, e2, g2 in spans[i + 1 :]:
            if s1 < e2 and s2 < e1:
                overlapping += 1
                assert not g1 & g2, "two items ran on one GPU at once"
    # T1 in a and in b (2 GPUs each, 1.5 s) start together on the two workers
    assert overlapping >= 1, "the two workers ran items side by side"
    leases = [g for _, _, g in spans]
    assert all(g <= {"0", "1", "2", "3"} for g in leases)


def test_records_go_under_the_directory_pytest_was_started_from_not_its_rootdir(
    stack: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """The repro directory and the project share only a distant ancestor (pytest's rootdir)."""
    root, base = stack
    here = tmp_path / "my-project"
    here.mkdir()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            f"--matrix={root / 'matrix.yaml'}",
            f"--repros-dir={root / 'repros'}",
            "--repros=T2",
            "--cell=a",
            str(root / "repros"),
        ],
        capture_output=True,
        text=True,
        cwd=here,
        env=base,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run,) = (here / "reports").glob("pytest-*")
    assert [r.repro for r in read_results(run / "results.jsonl")] == ["T2"]
    assert not list(root.parent.glob("reports")) and not list((root / "repros").glob("reports"))


def test_a_script_repro_declared_in_yaml_is_a_pytest_item_explored_like_in_run(
    stack: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    _, base = stack
    matrix = fake_stack.write_matrix(tmp_path / "matrix.yaml", ["a"])
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "train.py").write_text("raise ValueError('boom')\n")
    (mine / "repro.yaml").write_text(
        "repro:\n  id: yml\n  world_size: 1\n  script: train.py\n  fails_with: {type: ValueError, pattern: boom}\n"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "-rA",
            f"--matrix={matrix}",
            f"--repros-dir={mine}",
            "--cell=a",
            f"--repro-out={tmp_path / 'out'}",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=base,
        timeout=300,
    )
    assert proc.returncode == 0 and "PASSED" in proc.stdout and "repro.yaml::yml-bug[a]" in proc.stdout, proc.stdout
    (record,) = read_results(tmp_path / "out" / "results.jsonl")
    assert (record.outcome, record.explored) == ("REPRODUCED", True)


def test_pytest_help_lists_the_run_options_that_fit_a_test_session() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--help", "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
    )
    # Under a title for the one who reads it.
    assert "ft-regress: the repros as test items" in proc.stdout and "pytest_plugin.py" not in proc.stdout
    for flag in (
        "--repro-family",
        "--repro-executor",
        "--repro-repeat",
        "--repro-reruns",
        "--repro-pin",
        "--repro-as-of",
        "--repro-world-size",
        "--repro-model",
        "--repro-slurm-param",
        "--repro-ray-address",
        "--repro-cache-dir",
    ):
        assert flag in proc.stdout, flag


def test_family_repeat_and_the_stack_options_reach_the_ranks(stack: tuple[Path, dict[str, str]]) -> None:
    root, _ = stack
    out = root / "options-out"
    proc = pytest_run(
        stack,
        f"--repro-out={out}",
        "--cell=a",
        "--repro-family=llama",
        "--repro-repeat=2",
        "--repro-world-size=1",
        "--repro-as-of=2025-03-25",
        repros="T2",
    )
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout + proc.stderr
    (record,) = read_results(out / "results.jsonl")
    assert record.cell == "a@llama" and record.family == "llama" and record.world_size == 1
    assert record.repeat == 2 and [a.outcome for a in record.attempts] == ["NOT_REPRODUCED"] * 2
    for flag in ("--family llama", "--world-size 1", "--as-of 2025-03-25"):
        assert flag in record.repro_cmd, flag
    # Both attempts' ranks ran (the first kept beside the item), each told the family it trains.
    ranks = fake_stack.rank_records(out)
    assert len(ranks) == 2 and len(list((out / "items" / "a@llama").glob("T2-bug.attempt-1/rank0.json"))) == 1
    assert all(r["facts"]["params"]["family"] == "llama" for r in ranks)


def test_reruns_run_an_item_again_while_it_contradicts_its_expectation(
    stack: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    root, _ = stack
    repros = tmp_path / "flaky"
    fake_stack.write_repro(repros, "T5", "flaky", "REPRODUCED", world_size=1)
    out = tmp_path / "out"
    proc = pytest_run(
        stack, f"--repros-dir={repros}", f"--repro-out={out}", "--cell=a", "--repro-reruns=1", repros="T5"
    )
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout + proc.stderr
    (record,) = read_results(out / "results.jsonl")
    assert record.outcome == "REPRODUCED" and record.matched and record.flaky
    assert [a.outcome for a in record.attempts] == ["DIFFERENT_ERROR"]


def test_an_executor_named_under_pytest_runs_the_items(stack: tuple[Path, dict[str, str]]) -> None:
    """``--repro-executor slurm`` (submitit's local executor: no Slurm daemon here): each item runs as
    a job, on its node as the local executor runs it, and its files come back into the run."""
    root, _ = stack
    out = root / "slurm-out"
    proc = pytest_run(
        stack,
        f"--repro-out={out}",
        "--cell=a",
        "--repro-executor=slurm",
        "--repro-slurm-param=cluster=local",
        f"--repro-slurm-folder={root / 'slurm'}",
        repros="T2",
    )
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout + proc.stderr
    (record,) = read_results(out / "results.jsonl")
    assert record.node and record.outcome == "NOT_REPRODUCED"
    assert fake_stack.rank_records(out) and list((root / "slurm").iterdir())


def own_repro_project(tmp_path: Path) -> Path:
    """A user's project as ``init`` lays one out: the matrix naming its repros' directory."""
    project = tmp_path / "project"
    mine = project / "mine"
    mine.mkdir(parents=True)
    (mine / "train.py").write_text("raise ValueError('boom')\n")
    (mine / "repro.yaml").write_text(
        "repro:\n  id: yml\n  world_size: 1\n  script: train.py\n  fails_with: {type: ValueError, pattern: boom}\n"
    )
    fake_stack.write_matrix(project / "matrix.yaml", ["a"], extra={"repros_dirs": ["mine"]})
    return project


@pytest.mark.parametrize(
    "args",
    [["--cells", "a", "--repros", "yml"], ["mine/repro.yaml"]],
    ids=["selected-by-id", "named-by-path"],
)
def test_ones_own_repro_is_collected_through_the_matrixs_repros_dirs_or_by_its_path(
    stack: tuple[Path, dict[str, str]], tmp_path: Path, args: list[str]
) -> None:
    _, base = stack
    project = own_repro_project(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q", "-rA", *args],
        capture_output=True,
        text=True,
        cwd=project,
        env=base,
        timeout=300,
    )
    assert proc.returncode == 0 and "PASSED mine/repro.yaml::yml-bug[a]" in proc.stdout, proc.stdout + proc.stderr
    # The mark every repro item carries is known without pytest-xdist.
    assert "PytestUnknownMarkWarning" not in proc.stdout + proc.stderr


def test_a_failure_reruns_with_pytest_and_says_no_unknown_exit_code(
    stack: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    junit = tmp_path / "junit.xml"
    proc = pytest_run(stack, "--cells=a", "-p", "no:xdist", f"--junitxml={junit}", repros="T3")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rerun = next(line for line in proc.stdout.splitlines() if line.lstrip("E ").startswith("rerun: "))
    assert rerun.lstrip("E ").startswith("rerun: pytest ") and "::T3-bug[a]" in rerun and " --cells a " in rerun
    assert "exit code None" not in junit.read_text()
