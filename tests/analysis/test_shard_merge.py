"""``run --shard I/N`` and ``merge``: the split is deterministic, balanced and whole, and
the merged shards of a real run (stand-in torchrun, real orchestrator) equal the
unsharded run of the same plan."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from junitparser import JUnitXml

from harness.planning.shards import assign, durations_from, parse_shard
from harness.records.item import ItemRecord
from harness.records.results import read_results
from tests.support import fake_stack
from tests.support.paths import REPO_ROOT

REPROS = "T1,T2,T3,T4"
#: What must be equal between the merged shards and the unsharded run, item by item.
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
    "device",
)


def test_parse_shard_accepts_i_of_n_and_names_the_option_otherwise() -> None:
    assert (parse_shard("2/4").index, parse_shard("2/4").count) == (2, 4)
    for bad in ("3/2", "0/2", "x", "1/0", "1-2"):
        with pytest.raises(Exception, match="--shard") as exc:
            parse_shard(bad)
        assert "I/N" in str(exc.value) or "pick I" in str(exc.value)


def test_assign_is_whole_disjoint_deterministic_and_balanced() -> None:
    labels = [f"c{c}/F{r}/bug" for c in range(3) for r in range(7)]
    durations = {k: float((i * 7) % 11 + 1) for i, k in enumerate(labels)}
    parts = assign(labels, durations, 4)
    flat = [k for part in parts for k in part]
    assert sorted(flat) == sorted(labels) and len(flat) == len(set(flat))
    assert parts == assign(list(labels), dict(reversed(list(durations.items()))), 4)
    loads = [sum(durations[k] for k in part) for part in parts]
    assert max(loads) - min(loads) <= max(durations.values())
    for part in parts:  # plan order kept inside a shard
        assert part == sorted(part, key=labels.index)


def test_assign_balances_by_time_not_by_count() -> None:
    labels = ["a/slow/bug", "a/f1/bug", "a/f2/bug", "a/f3/bug"]
    parts = assign(labels, {"a/slow/bug": 30.0, "a/f1/bug": 10.0, "a/f2/bug": 10.0, "a/f3/bug": 10.0}, 2)
    assert ["a/slow/bug"] in parts and ["a/f1/bug", "a/f2/bug", "a/f3/bug"] in parts


def test_unknown_items_weigh_the_median_and_more_shards_than_items_leave_some_empty() -> None:
    parts = assign(["x/a/bug", "x/b/bug"], {}, 3)
    assert sorted(len(p) for p in parts) == [0, 1, 1]


def test_durations_come_from_the_newest_record_of_each_item(tmp_path: Path) -> None:
    def write(run: str, records: list[dict[str, Any]]) -> None:
        (tmp_path / run).mkdir()
        (tmp_path / run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))

    base = {
        "schema_version": 1,
        "run_id": "RUN",
        "cell": "c",
        "repro": "F1",
        "mode": "bug",
        "outcome": "PASS",
        "signature": None,
        "expected": "PASS",
        "matched": True,
        "versions": {},
        "world_size": 2,
        "device": "cpu",
        "error": None,
        "reasons": [],
        "guards": [],
        "env": None,
        "repro_cmd": "python -m harness run",
        "started_at": "2026-01-01T00:00:00",
    }
    write("old", [{**base, "wall_s": 5.0, "finished_at": "2026-01-01T00:00:00"}])
    write(
        "new",
        [
            {**base, "wall_s": 7.0, "finished_at": "2026-02-01T00:00:00"},
            {**base, "mode": "fixed", "wall_s": 0.0, "finished_at": "2026-02-01T00:00:00"},
        ],
    )
    assert durations_from(tmp_path) == {"c/F1/bug": 7.0}
    assert durations_from(tmp_path / "nowhere") == {}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("fake-stack")
    env = fake_stack.run_env(fake_stack.install(root))
    for repro_id, behaviour, expected in (
        ("T1", "raise", "REPRODUCED"),
        ("T2", "clean", "NOT_REPRODUCED"),
        ("T3", "other", "REPRODUCED"),  # DIFFERENT_ERROR: does not match
        ("T4", "raise", "NOT_REPRODUCED"),  # REPRODUCED: does not match
    ):
        fake_stack.write_repro(root / "repros", repro_id, behaviour, expected)
    fake_stack.write_matrix(root / "matrix.yaml", ["a", "b"])
    return root, env


def harness(stack: tuple[Path, dict[str, str]], *args: str) -> subprocess.CompletedProcess[str]:
    root, env = stack
    command = [sys.executable, "-m", "harness", *args]
    if args[0] == "run":
        command += [
            "--matrix",
            str(root / "matrix.yaml"),
            "--repros-dir",
            str(root / "repros"),
            "--repros",
            REPROS,
            "--cache-dir",
            str(root / "cache"),
        ]
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=300)


def observed(records: list[ItemRecord]) -> list[dict[str, Any]]:
    return [{k: getattr(r, k) for k in OBSERVED} for r in records]


def test_merged_shards_equal_the_unsharded_run(stack: tuple[Path, dict[str, str]]) -> None:
    root, _ = stack
    whole = harness(stack, "run", "--out", str(root / "history" / "whole"))
    assert whole.returncode == 1, whole.stdout + whole.stderr  # T3 and T4 do not match
    unsharded = read_results(root / "history" / "whole" / "results.jsonl")
    assert len(unsharded) == 8

    shard_dirs = []
    for i in (1, 2, 3):
        out = root / "shards" / f"s{i}"
        proc = harness(stack, "run", "--shard", f"{i}/3", "--reports-dir", str(root / "history"), "--out", str(out))
        assert proc.returncode in (0, 1), proc.stdout + proc.stderr
        assert f"shard {i}/3 of 8 items" in proc.stdout
        shard_dirs.append(out)
    parts = [read_results(d / "results.jsonl") for d in shard_dirs]
    assert all(parts), "every shard got items"
    meta = [json.loads((d / "run.json").read_text())["shard"] for d in shard_dirs]
    assert meta[0]["balanced_by"]["items_timed"] == 8  # the history was read

    merged = harness(stack, "merge", str(root / "merged"), *map(str, shard_dirs))
    assert merged.returncode == 0, merged.stdout + merged.stderr
    records = read_results(root / "merged" / "results.jsonl")
    assert observed(records) == observed(unsharded)  # same items, same observations, same order

    def cases(path: Path) -> list[tuple[str, str, bool]]:
        suite = next(iter(JUnitXml.fromfile(str(path))))
        return sorted((c.classname, c.name, c.is_passed) for c in suite)

    assert cases(root / "merged" / "junit.xml") == cases(root / "history" / "whole" / "junit.xml")
    run = json.loads((root / "merged" / "run.json").read_text())
    assert [s["shard"] for s in run["shards"]] == [1, 2, 3] and "incomplete" not in run
    assert run["planned"] == json.loads((root / "history" / "whole" / "run.json").read_text())["planned"]

    report = harness(stack, "compare", str(root / "history" / "whole"), str(root / "merged"))
    assert report.returncode == 0, report.stdout  # nothing regressed between the two


def test_merge_refuses_overlapping_shards_and_reports_a_missing_one(stack: tuple[Path, dict[str, str]]) -> None:
    root, _ = stack
    one = root / "shards" / "s1"
    if not (one / "results.jsonl").exists():
        pytest.skip("needs the shards of test_merged_shards_equal_the_unsharded_run")
    twice = harness(stack, "merge", str(root / "twice"), str(one), str(one))
    assert twice.returncode == 2 and "once" in twice.stderr and "error:" in twice.stderr
    partial = harness(stack, "merge", str(root / "partial"), str(one), str(root / "shards" / "s3"))
    assert partial.returncode == 0, partial.stderr
    assert "shard 2/3 missing" in partial.stdout
    run = json.loads((root / "partial" / "run.json").read_text())
    assert run["incomplete"]["not_run"]
    unsharded = harness(stack, "merge", str(root / "mixed"), str(one), str(root / "history" / "whole"))
    assert unsharded.returncode == 2 and "records" in unsharded.stderr


def test_resume_keeps_the_shard_it_was_given(stack: tuple[Path, dict[str, str]]) -> None:
    root, _ = stack
    out = root / "resumed"
    first = harness(stack, "run", "--shard", "2/3", "--out", str(out))
    assert first.returncode in (0, 1), first.stderr
    planned = json.loads((out / "run.json").read_text())["shard"]["items"]
    lines = (out / "results.jsonl").read_text().splitlines(keepends=True)
    (out / "results.jsonl").write_text("".join(lines[:1]))  # as if interrupted after one item
    again = subprocess.run(
        [sys.executable, "-m", "harness", "run", "--resume", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=stack[1],
        timeout=300,
    )
    assert again.returncode in (0, 1), again.stdout + again.stderr
    labels = [r.id.label() for r in read_results(out / "results.jsonl")]
    assert sorted(labels) == sorted(planned)


def test_bad_shard_is_one_line_and_exit_2(stack: tuple[Path, dict[str, str]]) -> None:
    for bad in ("3/2", "x"):
        proc = harness(stack, "run", "--shard", bad, "--out", str(stack[0] / "never"))
        assert proc.returncode == 2
        assert proc.stderr.startswith("error: --shard:") and len(proc.stderr.strip().splitlines()) == 1
        assert not (stack[0] / "never").exists()
