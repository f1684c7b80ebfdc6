"""A torn or foreign record is never dropped in silence (issue 40, class 1): a results file whose
last line is a record cut short mid-write makes ``compare``, ``merge``, ``report`` and ``watch``
say "torn" and name the item, never show it as removed or shrink the plan without it; two runs
that pair on nothing are refused as such, never reported as "no changes"."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from harness.records.results import read_results
from tests.support import fake_stack
from tests.support.paths import REPO_ROOT
from tests.support.report_fixture import records, write_run
from tests.workflows.test_watch_command import harness as harness_in

STARTED = "2026-11-20T10:00:00+00:00"


def harness(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )


def tear_last_record(results: Path) -> str:
    """Cut the file's last record short, as a run killed mid-write leaves it; its item's label."""
    lines = results.read_text().splitlines(keepends=True)
    last = json.loads(lines[-1])
    whole = lines[-1].rstrip("\n")
    results.write_text("".join(lines[:-1]) + whole[: len(whole) * 2 // 3])
    return f"{last['cell']}/{last['repro']}/{last['mode']}"


def test_a_torn_record_is_read_as_torn_naming_its_item(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", "run", STARTED, records("run"))
    torn = tear_last_record(run / "results.jsonl")
    read = read_results(run / "results.jsonl")
    assert read.torn is not None and read.torn.item is not None and read.torn.item.label() == torn
    assert read.torn.line == len(records("run")) and len(read) == len(records("run")) - 1
    assert "is torn" in read.torn.describe() and torn in read.torn.describe()


def test_compare_says_torn_and_never_shows_the_item_as_removed(tmp_path: Path) -> None:
    old = write_run(tmp_path / "old", "old", STARTED, records("old"))
    new = write_run(tmp_path / "new", "new", STARTED, records("new"))
    torn = tear_last_record(new / "results.jsonl")
    done = harness("compare", str(old), str(new))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "torn" in done.stderr and torn in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "### record torn (1)" in done.stdout and f"| {torn} |" in done.stdout
    assert "### removed" not in done.stdout and "No changes" not in done.stdout
    assert "1 record torn" in done.stdout


def test_merge_says_torn_and_keeps_the_item_in_the_plan(tmp_path: Path) -> None:
    shard = write_run(tmp_path / "shard", "shard", STARTED, records("shard"))
    torn = tear_last_record(shard / "results.jsonl")
    done = harness("merge", str(tmp_path / "merged"), str(shard))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "torn" in done.stdout and torn in done.stdout
    meta = json.loads((tmp_path / "merged" / "run.json").read_text())
    assert torn in meta["planned"] and torn in meta["incomplete"]["not_run"]
    assert any(torn in line for line in meta["incomplete"]["torn"])
    assert len(read_results(tmp_path / "merged" / "results.jsonl")) == len(records("shard")) - 1


def test_report_of_a_torn_run_says_so_on_its_page(tmp_path: Path) -> None:
    run = write_run(tmp_path / "reports" / "run", "run", STARTED, records("run"))
    torn = tear_last_record(run / "results.jsonl")
    done = harness("report", str(run))
    assert done.returncode in (0, 1), done.stdout + done.stderr
    page = (run / "index.html").read_text()
    assert "is torn" in page and torn in page


def test_two_runs_with_no_item_in_common_compare_nothing_and_say_so(tmp_path: Path) -> None:
    old = write_run(tmp_path / "old", "old", STARTED, records("old"))
    others = [{**r, "cell": f"other-{r['cell']}"} for r in records("new")]
    new = write_run(tmp_path / "new", "new", STARTED, others)
    done = harness("compare", str(old), str(new))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "nothing compared" in done.stderr and "other-current" in done.stderr
    assert "No changes" not in done.stdout and "Nothing compared" in done.stdout


def _nights(tmp_path: Path) -> dict[str, str]:
    env = fake_stack.run_env(fake_stack.install(tmp_path))
    fake_stack.write_matrix(tmp_path / "matrix.yaml", ["a", "b"])
    fake_stack.write_repro(tmp_path / "repros", "R1", "clean", "NOT_REPRODUCED")
    first = harness_in(tmp_path, env, "run", "--out", str(tmp_path / "n1"))
    assert first.returncode == 0, first.stdout + first.stderr
    return env


def test_watch_names_what_it_could_not_pair_and_why(tmp_path: Path) -> None:
    env = _nights(tmp_path)
    torn = tear_last_record(tmp_path / "n1" / "results.jsonl")
    watch = harness_in(
        tmp_path, env, "watch", "--previous", str(tmp_path / "n1"), "--out", str(tmp_path / "n2"),
        "--no-update-expectations",
    )  # fmt: skip
    assert watch.returncode == 0, watch.stdout + watch.stderr
    said = " ".join(watch.stdout.split())
    assert f"not compared: tonight's {torn} has no record in" in said and "its record there is torn" in said
    assert "1 of the 2 items" not in said and "0 of the 1 items compared changed" in said
    assert "No item of those compared changed its outcome. 1 item could not be compared." in said
    meta = json.loads((tmp_path / "n2" / "run.json").read_text())
    assert meta["watch"]["compared"] == 1 and len(meta["watch"]["not_compared"]) == 1
    assert "1 item could not be compared" in (tmp_path / "n2" / "changes.md").read_text()


def test_watch_against_a_night_it_cannot_pair_with_is_refused_never_nothing_changed(tmp_path: Path) -> None:
    env = _nights(tmp_path)
    fake_stack.write_matrix(tmp_path / "matrix.yaml", ["c"])  # tonight's lane holds other cells
    watch = harness_in(
        tmp_path, env, "watch", "--previous", str(tmp_path / "n1"), "--out", str(tmp_path / "n2"),
        "--no-update-expectations",
    )  # fmt: skip
    assert watch.returncode == 2, watch.stdout + watch.stderr
    assert "pairs with none of tonight's 1 items: nothing was compared" in watch.stderr
    assert "No item changed" not in watch.stdout and "did not plan it" in " ".join(watch.stdout.split())
    # Tonight's run is kept, and says what it was compared with.
    meta = json.loads((tmp_path / "n2" / "run.json").read_text())
    assert meta["watch"]["compared"] == 0 and read_results(tmp_path / "n2" / "results.jsonl")
