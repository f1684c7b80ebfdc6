"""watch's judgement of a change: the verdict from the two outcomes, and the culprit from what the
reruns and bisects observed (faked here: the bisects and reruns themselves are tested elsewhere and
in tests/integration/test_watch_nights.py)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version
from rich.console import Console

from harness.config.matrix import load_matrix
from harness.config.repros import discover
from harness.planning.items import PlannedItem
from harness.planning.run_options import CacheChoice, RunOptions
from harness.records.changes import CHANGED, FIXED_UPSTREAM, FLAKY, REGRESSED
from harness.records.item import ItemRecord
from harness.records.run_meta import CellMeta, RunMeta
from harness.workflows.bisect.runner import BisectOptions, BisectReport
from harness.workflows.watch import classify as classify_mod
from harness.workflows.watch.classify import WatchContext, classify
from harness.workflows.watch.nights import Candidate, Night, changed_items, moved_between, outcome_changed
from harness.workflows.watch.verdicts import verdict_of
from repros.runtime.spec import MODES
from tests.support.paths import REPO_ROOT
from tests.support.report_fixture import _record, typed


def record(cell: str, repro: str, mode: str, outcome: str, **fields: Any) -> ItemRecord:
    return typed([_record(cell, repro, mode, outcome, **fields)])[0]


def error(etype: str) -> dict[str, Any]:
    return {"type": etype, "message": "m", "traceback": "", "rank": 0}


@pytest.mark.parametrize(
    "mode, before, after, verdict",
    [
        ("bug", ("REPRODUCED", "F9.sig", "RuntimeError"), ("NOT_REPRODUCED", None, None), FIXED_UPSTREAM),
        ("bug", ("NOT_REPRODUCED", None, None), ("REPRODUCED", "F9.sig", "RuntimeError"), REGRESSED),
        ("fixed", ("PASS", None, None), ("FAIL", None, "AssertionError"), REGRESSED),
        ("bug", ("REPRODUCED", "F9.sig", "RuntimeError"), ("DIFFERENT_ERROR", None, "KeyError"), REGRESSED),
        ("bug", ("REPRODUCED", "F4.a", "KeyError"), ("REPRODUCED", "F4.b", "ValueError"), REGRESSED),
        ("fixed", ("FAIL", None, "AssertionError"), ("PASS", None, None), CHANGED),
        ("fixed", ("PASS", None, None), ("INFRA", None, "EnvironmentUnavailable"), CHANGED),
        ("fixed", ("UNRESOLVABLE", None, None), ("FAIL", None, "AssertionError"), CHANGED),
    ],
)
def test_the_verdict_follows_from_the_two_outcomes(
    mode: str, before: tuple[str, str | None, str | None], after: tuple[str, str | None, str | None], verdict: str
) -> None:
    was = record("c", "F9", mode, before[0], signature=before[1], error=error(before[2]) if before[2] else None)
    now = record("c", "F9", mode, after[0], signature=after[1], error=error(after[2]) if after[2] else None)
    assert outcome_changed(was, now)
    assert verdict_of(was, now)[0] == verdict


def test_the_same_outcome_and_signature_is_no_change() -> None:
    was = record("c", "F9", "bug", "REPRODUCED", signature="F9.sig", error=error("RuntimeError"))
    assert not outcome_changed(was, was)
    assert not outcome_changed(record("c", "F9", "fixed", "PASS"), record("c", "F9", "fixed", "PASS"))


def test_moved_names_every_distribution_that_changed_appeared_or_went() -> None:
    moved = moved_between(
        {"peft": "0.15.0", "numpy": "2.2", "old": "1"}, {"peft": "0.15.1", "numpy": "2.2", "new": "2"}
    )
    assert moved == {"new": (None, "2"), "old": ("1", None), "peft": ("0.15.0", "0.15.1")}


def night(tmp_path: Path, name: str, records: list[ItemRecord], packages: dict[str, str], as_of: str | None) -> Night:
    meta = RunMeta(run_id=name, as_of=as_of, started_at="2026-11-24T02:17:00+00:00")
    meta = meta.with_cell("watch-cell", CellMeta(packages=packages, lock=[f"{k}=={v}" for k, v in packages.items()]))
    return Night(tmp_path / name, meta, records)


@pytest.fixture
def context(tmp_path: Path) -> WatchContext:
    discovery = discover()
    matrix = load_matrix(REPO_ROOT / "matrix.yaml", known_repros=discovery.repros.keys(), known_modes=MODES)
    cell = matrix.cells["current"]
    import dataclasses

    cell = dataclasses.replace(cell, name="watch-cell", packages={**cell.packages, "peft": ">=0.15,<0.16"})
    before = record("watch-cell", "F9", "bug", "REPRODUCED", signature="F9.modules-to-save-shape-0")
    after = record("watch-cell", "F9", "bug", "NOT_REPRODUCED")
    previous = night(
        tmp_path, "n1", [before], {"torch": "2.13.0", "peft": "0.15.0", "accelerate": "1.5.2"}, "2025-03-25"
    )
    tonight = night(tmp_path, "n2", [after], {"torch": "2.13.0", "peft": "0.15.1", "accelerate": "1.6.0"}, "2025-04-05")
    opts = RunOptions(matrix=matrix, discovery=discovery, cache=CacheChoice(resolved=tmp_path / "cache"))
    planned = PlannedItem(cell, "F9", discovery.repros["F9"].module, "bug", 2)
    return WatchContext(
        opts,
        previous,
        tonight,
        {("watch-cell", "F9", "bug"): planned},
        tmp_path / "w",
        Console(file=open(tmp_path / "log", "w")),
    )


def report(**fields: Any) -> BisectReport:
    base: dict[str, Any] = {
        "run_id": "b",
        "repro": "F9",
        "mode": "bug",
        "axis": "version",
        "package": "peft",
        "good": "0.15.0",
        "bad": "0.15.2",
        "points": ["0.15.0", "0.15.1", "0.15.2"],
        "kind": "regression",
        "status": "found",
        "boundary": "0.15.1",
        "candidates": [],
        "skipped": [],
        "failed_differently": [],
        "steps": [],
        "environments_built": 0,
        "wall_s": 1.0,
        "final": "first bad: peft==0.15.1",
        "directory": "/tmp/b",
    }
    return BisectReport.model_validate({**base, **fields})


def one_moved(ctx: WatchContext) -> Candidate:
    (candidate,) = changed_items(ctx.previous, ctx.tonight)
    return Candidate(candidate.before, candidate.after, {"peft": ("0.15.0", "0.15.2")})


def test_one_package_moved_its_releases_are_bisected_and_the_culprit_named(
    context: WatchContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[BisectOptions] = []

    def fake_bisect(opts: BisectOptions, console: Console) -> BisectReport:
        asked.append(opts)
        return report()

    monkeypatch.setattr(classify_mod, "run_bisect", fake_bisect)
    monkeypatch.setattr(
        classify_mod, "released_versions", lambda p, pre=False: [Version(v) for v in ("0.15.0", "0.15.1", "0.15.2")]
    )
    change = classify(context, one_moved(context))
    assert change.verdict == FIXED_UPSTREAM
    assert change.culprit is not None and (change.culprit.last, change.culprit.first) == ("0.15.0", "0.15.1")
    (opts,) = asked
    assert (opts.package, opts.good, opts.bad) == ("peft", "0.15.0", "0.15.2")
    # Everything else stays as it resolved tonight.
    assert opts.base is not None and opts.base.packages["accelerate"] == "==1.6.0" and opts.base.lock is None


@pytest.mark.parametrize(
    "fields, verdict, words",
    [
        ({"status": "endpoints-agree", "boundary": None}, FLAKY, "did not hold"),
        (
            {"status": "ambiguous", "boundary": None, "candidates": ["0.15.1", "0.15.2"], "skipped": ["0.15.1"]},
            FIXED_UPSTREAM,
            "range left: 0.15.1 .. 0.15.2",
        ),
    ],
)
def test_a_bisect_that_cannot_decide_names_no_culprit_but_the_range_left(
    context: WatchContext, monkeypatch: pytest.MonkeyPatch, fields: dict[str, Any], verdict: str, words: str
) -> None:
    monkeypatch.setattr(classify_mod, "run_bisect", lambda opts, console: report(**fields))
    monkeypatch.setattr(classify_mod, "released_versions", lambda p, pre=False: [Version("0.15.0"), Version("0.15.2")])
    change = classify(context, one_moved(context))
    assert change.verdict == verdict and change.culprit is None and words in change.reason


def test_several_moved_the_days_are_bisected_then_the_one_package_of_that_day(
    context: WatchContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[BisectOptions] = []

    def fake_bisect(opts: BisectOptions, console: Console) -> BisectReport:
        asked.append(opts)
        return report(
            axis="date",
            package=None,
            good="2025-03-24",
            bad="2025-04-04",
            points=[str(dt.date(2025, 3, 24) + dt.timedelta(days=i)) for i in range(12)],
            boundary="2025-03-27",
            moved_on_boundary={"peft": ("0.15.0", "0.15.1")},
            final="first bad: 2025-03-27 (peft 0.15.0 -> 0.15.1)",
        )

    monkeypatch.setattr(classify_mod, "run_bisect", fake_bisect)
    monkeypatch.setattr(classify_mod, "released_versions", lambda p, pre=False: [Version("0.15.0"), Version("0.15.1")])
    (candidate,) = changed_items(context.previous, context.tonight)
    assert set(candidate.moved) == {"peft", "accelerate"}
    change = classify(context, candidate)
    (opts,) = asked  # adjacent releases: no second bisect
    assert opts.by_date and (opts.good, opts.bad) == ("2025-03-24", "2025-04-04")
    assert opts.hold == ("torch", "deepspeed", "transformers", "bitsandbytes")  # what did not move
    assert change.culprit is not None and change.culprit.package == "peft"
    assert (change.culprit.last, change.culprit.first) == ("0.15.0", "0.15.1")
    assert change.evidence["day"] == "2025-03-27"


@pytest.mark.parametrize("alone_flips", [["peft"], ["huggingface-hub"], []])
def test_several_moving_on_the_day_found_each_is_moved_alone(
    context: WatchContext, monkeypatch: pytest.MonkeyPatch, alone_flips: list[str]
) -> None:
    monkeypatch.setattr(
        classify_mod,
        "run_bisect",
        lambda opts, console: report(
            axis="date",
            boundary="2025-03-27",
            points=["2025-03-26", "2025-03-27"],
            moved_on_boundary={"peft": ("0.15.0", "0.15.1"), "huggingface-hub": ("0.29.3", "0.30.0")},
            locks={"2025-03-26": ["torch==2.13.0", "peft==0.15.0", "huggingface-hub==0.29.3", "accelerate==1.5.2"]},
        ),
    )
    probed: list[Any] = []

    def fake_probe(ctx: WatchContext, planned: PlannedItem, cell: Any, out: Path) -> ItemRecord:
        probed.append(cell)
        moved = next(n for n in ("peft", "huggingface-hub") if f"+{n}-" in cell.name)
        outcome = "NOT_REPRODUCED" if moved in alone_flips else "REPRODUCED"
        return record("watch-cell", "F9", "bug", outcome, signature=None if moved in alone_flips else "F9.x")

    monkeypatch.setattr(classify_mod, "probe_item", fake_probe)
    (candidate,) = changed_items(context.previous, context.tonight)
    change = classify(context, candidate)
    # The cell's own package first, everything else as it resolved by the end of the day before.
    assert probed[0].packages["peft"] == "==0.15.1" and probed[0].packages["accelerate"] == "==1.5.2"
    assert probed[0].as_of == "2025-03-27" and probed[0].lock is None
    if alone_flips:
        assert change.culprit is not None and change.culprit.package == alone_flips[0]
        assert len(probed) == (1 if alone_flips == ["peft"] else 2)
    else:
        assert change.culprit is None and "no one of them alone shows it" in change.reason
        assert change.evidence["alone"] == {"peft": "REPRODUCED", "huggingface-hub": "REPRODUCED"}


def test_nothing_moved_reruns_decide_flaky_or_confirmed(context: WatchContext, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    class FakeSession:
        def __init__(self, opts: RunOptions, console: Any, argv: Any, resume: Any, plan: Any, kind: str) -> None:
            seen.update(opts=opts, plan=plan, kind=kind)

        def execute(self) -> int:
            out = seen["opts"].out_dir
            out.mkdir(parents=True)
            outcome = seen["outcome"]
            counts = {"NOT_REPRODUCED": 3} if outcome == "NOT_REPRODUCED" else {"NOT_REPRODUCED": 1, "REPRODUCED": 2}
            rec = _record("watch-cell", "F9", "bug", outcome, repeat=3, outcome_counts=counts)
            (out / "results.jsonl").write_text(__import__("json").dumps(rec) + "\n")
            return 0

    monkeypatch.setattr(classify_mod, "RunSession", FakeSession)
    (candidate,) = changed_items(context.previous, context.tonight)
    still = Candidate(candidate.before, candidate.after, {})
    seen["outcome"] = "NOT_REPRODUCED"
    confirmed = classify(context, still)
    assert confirmed.verdict == FIXED_UPSTREAM and "3 more runs showed it every time" in confirmed.reason
    assert seen["opts"].attempts.repeat == 3 and seen["kind"] == "watch-confirm"
    # Rerun at tonight's lock, not resolved again.
    assert seen["plan"].items[0].cell.lock == tuple(context.tonight.meta.cells["watch-cell"].lock)
    seen["outcome"] = "FLAKY"
    import shutil

    shutil.rmtree(seen["opts"].out_dir)
    assert classify(context, still).verdict == FLAKY
