"""Why an item changed between two nights: run it again, or bisect what moved.

- Nothing moved under it: the item runs again ``confirm`` times in tonight's environment. Any
  attempt with the previous night's outcome makes it ``flaky``; all showing tonight's confirm it.
- One package moved: bisect that package's releases between the two nights' versions, every other
  package pinned to tonight's.
- Several moved: bisect the days between the two nights (held: what did not move), then, on the
  day found, the releases of the one package that moved that day; where several moved that day
  (a dependency released beside it), move each alone from the day before, the cell's own
  packages first: the one whose move alone shows the new outcome is the culprit.

A bisect whose endpoints agree (the change did not show again) makes the change ``flaky``; one that
cannot decide (a release that does not install, an outcome that goes back and forth) leaves the
culprit null and says which range is left. Nothing here decides an outcome: every observation is a
real run of the item, recorded in its own directory under the watch run's ``watch/``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version
from rich.console import Console

from harness.config.model import Cell
from harness.core.errors import UserError
from harness.environments.releases import VersionsUnavailable, between, released_versions
from harness.pipeline.session import RunSession
from harness.planning.items import Plan, PlannedItem
from harness.planning.run_options import AttemptPolicy, RunOptions
from harness.records.bisect import FOUND, BisectReport
from harness.records.changes import FLAKY, Change, Culprit
from harness.records.item import ItemRecord
from harness.records.run_dir import RunDir
from harness.workflows.bisect.runner import BisectOptions, run_bisect
from harness.workflows.watch.nights import Candidate, Night
from harness.workflows.watch.verdicts import observed, verdict_of
from repros.runtime.outcomes import Outcome

#: How many times an item runs again where nothing moved under it.
DEFAULT_CONFIRM = 3


@dataclass(frozen=True)
class WatchContext:
    run: RunOptions
    previous: Night
    tonight: Night
    #: Tonight's planned items, by (cell, repro, mode): the cells as they ran.
    planned: dict[tuple[str, str, str], PlannedItem]
    work_dir: Path
    console: Console
    confirm: int = DEFAULT_CONFIRM


def item_dir(ctx: WatchContext, record: ItemRecord) -> Path:
    return ctx.work_dir / record.cell / f"{record.repro}-{record.mode}"


def _signature(record: ItemRecord) -> tuple[str, str | None]:
    return str(record.outcome), record.signature


def _change(candidate: Candidate, verdict: str, reason: str, **more: object) -> Change:
    before, after = candidate.before, candidate.after
    return Change.model_validate(
        {
            "cell": after.cell,
            "repro": after.repro,
            "mode": after.mode,
            "before": str(before.outcome),
            "after": str(after.outcome),
            "moved": candidate.moved,
            "verdict": verdict,
            "reason": reason,
            "before_signature": before.signature,
            "after_signature": after.signature,
            "previous_cell": before.cell if before.cell != after.cell else None,
            **more,
        }
    )


def classify(ctx: WatchContext, candidate: Candidate) -> Change:
    before, after = candidate.before, candidate.after
    if after.outcome == Outcome.FLAKY or before.outcome == Outcome.FLAKY:
        counts = after.outcome_counts or before.outcome_counts or {}
        return _change(candidate, FLAKY, "its attempts disagreed within one night", evidence={"attempts": counts})
    if not observed(before) or not observed(after):
        verdict, reason = verdict_of(before, after)
        return _change(candidate, verdict, reason)
    if not candidate.moved:
        return confirm(ctx, candidate)
    if len(candidate.moved) == 1:
        (package, (last, first)), *_ = candidate.moved.items()
        return by_release(ctx, candidate, package, last, first, pinned_to_tonight(ctx, after))
    return by_date(ctx, candidate)


# ----------------------------------------------------------------------- nothing moved


def confirm(ctx: WatchContext, candidate: Candidate) -> Change:
    """Run the item again ``ctx.confirm`` times in tonight's environment (its lock, where it floats)."""
    after = candidate.after
    planned = ctx.planned.get(after.key)
    if planned is None:
        verdict, reason = verdict_of(candidate.before, after)
        return _change(candidate, verdict, f"{reason}; nothing moved, and the item is not in tonight's plan to rerun")
    cell = planned.cell
    lock = ctx.tonight.lock(cell.name)
    if lock is not None:
        cell = dataclasses.replace(cell, lock=lock, as_of=None)
    out = item_dir(ctx, after) / "confirm"
    opts = dataclasses.replace(
        ctx.run,
        attempts=AttemptPolicy(repeat=ctx.confirm),
        stack=ctx.run.stack.evolve(pins=()),
        selection=ctx.run.selection.evolve(shard=None),
        out_dir=out,
        explore=True,
        save_expectations=False,
    )
    ctx.console.print(f"{after.id.label()}: nothing moved; running it {ctx.confirm} more times", highlight=False)
    plan = Plan(items=[dataclasses.replace(planned, cell=cell)])
    RunSession(opts, ctx.console, ["watch", "confirm"], None, plan=plan, kind="watch-confirm").execute()
    records = RunDir(out).records()
    attempts = [str(a.outcome) for r in records for a in (r.attempts or [])] or [str(r.outcome) for r in records]
    counts = records[0].outcome_counts if records and records[0].outcome_counts else {}
    evidence = {"reruns": str(out), "attempts": dict(counts) or {o: attempts.count(o) for o in set(attempts)}}
    again = [r for r in records if r.outcome != Outcome.FLAKY]
    if not records or not again or any(_signature(r) != _signature(after) for r in again):
        return _change(
            candidate,
            FLAKY,
            f"nothing moved, and running it {ctx.confirm} more times did not show {after.outcome} every time",
            evidence=evidence,
        )
    verdict, reason = verdict_of(candidate.before, after)
    return _change(
        candidate,
        verdict,
        f"{reason}; nothing in its versions moved, and {ctx.confirm} more runs showed it every time "
        "(something outside the packages changed: the harness, the machine)",
        evidence=evidence,
    )


# ----------------------------------------------------------------------- bisects


def pinned_to_tonight(ctx: WatchContext, record: ItemRecord, versions: dict[str, str] | None = None) -> Cell | None:
    """Tonight's cell with each of its packages pinned to what it resolved to (or to ``versions``)."""
    planned = ctx.planned.get(record.key)
    if planned is None:
        return None
    installed = versions if versions is not None else ctx.tonight.installed(record)
    cell = planned.cell
    packages = {name: f"=={installed[name]}" if name in installed else spec for name, spec in cell.packages.items()}
    return dataclasses.replace(cell, packages=packages, lock=None, as_of=None, origin=cell.origin or cell.name)


def _is_pre(*versions: str | None) -> bool:
    try:
        return any(Version(v).is_prerelease for v in versions if v)
    except InvalidVersion:
        return False


def _culprit(report: BisectReport, package: str) -> Culprit | None:
    """The last release with the old outcome and the first with the new one. The bisect's "good"
    end is the previous night's (old) outcome: found as ``regression`` (good older), the boundary
    is the first new one; as ``fix`` (good newer: a downgrade), the last old one."""
    if report.status != FOUND or report.boundary is None:
        return None
    beside = report.before_boundary()
    if beside is None:
        return None
    if report.kind == "regression":
        return Culprit(package=package, last=beside, first=report.boundary)
    return Culprit(package=package, last=report.boundary, first=beside)


def _undecided(report: BisectReport, what: str) -> str:
    left = report.candidates or report.points
    span = f"{left[0]} .. {left[-1]}" if left else "none"
    return f"the bisect of {what} could not decide ({report.final}); range left: {span}"


def _bisect(ctx: WatchContext, candidate: Candidate, opts: BisectOptions) -> BisectReport | str:
    try:
        return run_bisect(opts, ctx.console)
    except UserError as exc:
        return str(exc)


def by_release(
    ctx: WatchContext, candidate: Candidate, package: str, last: str | None, first: str | None, base: Cell | None
) -> Change:
    after = candidate.after
    verdict, reason = verdict_of(candidate.before, after)
    if last is None or first is None or base is None:
        how = "appeared" if last is None else "disappeared" if first is None else "moved"
        return _change(candidate, verdict, f"{reason}; only {package} {how} ({last} -> {first}), nothing to bisect")
    try:
        pre = _is_pre(last, first) or base.prerelease
        releases = released_versions(package, pre=pre)
        inside = between(releases, min(Version(last), Version(first)), max(Version(last), Version(first)), pre=pre)
    except (VersionsUnavailable, InvalidVersion) as exc:
        return _change(candidate, verdict, f"{reason}; {package}'s releases could not be listed ({exc})")
    ctx.console.print(
        f"{after.id.label()}: {package} moved {last} -> {first}; bisecting its {len(inside)} releases", highlight=False
    )
    opts = BisectOptions(
        run=bisect_run(ctx, item_dir(ctx, after) / f"bisect-{package}"),
        repro=after.repro,
        mode=after.mode,
        package=package,
        good=last,
        bad=first,
        pre=_is_pre(last, first) or base.prerelease,
        base=base,
    )
    report = _bisect(ctx, candidate, opts)
    if isinstance(report, str):
        return _change(candidate, verdict, f"{reason}; {package} {last} -> {first} could not be bisected: {report}")
    evidence = {"bisect": report.directory, "final": report.final, "steps": len(report.steps)}
    return _judged(candidate, report, package, verdict, reason, evidence)


def _judged(
    candidate: Candidate, report: BisectReport, package: str, verdict: str, reason: str, evidence: dict[str, object]
) -> Change:
    if report.status == "endpoints-agree":
        return _change(
            candidate,
            FLAKY,
            f"run again at both ends ({report.good} and {report.bad}) the item showed the same outcome: "
            "the change did not hold",
            evidence=evidence,
        )
    culprit = _culprit(report, package)
    if culprit is None:
        return _change(candidate, verdict, f"{reason}; {_undecided(report, package)}", evidence=evidence)
    return _change(
        candidate,
        verdict,
        f"{reason}; {package} {culprit.last} is the last release with the old outcome, {culprit.first} the first "
        "with the new one",
        culprit=culprit,
        evidence=evidence,
    )


def by_date(ctx: WatchContext, candidate: Candidate) -> Change:
    after = candidate.after
    verdict, reason = verdict_of(candidate.before, after)
    moved = ", ".join(f"{n} {a or '-'} -> {b or '-'}" for n, (a, b) in candidate.moved.items())
    planned = ctx.planned.get(after.key)
    base = pinned_to_tonight(ctx, after)
    good_day, bad_day = ctx.previous.day(), ctx.tonight.day()
    if planned is None or base is None:
        return _change(candidate, verdict, f"{reason}; {moved} moved, and the item is not in tonight's plan")
    if good_day == bad_day:
        return _change(
            candidate, verdict, f"{reason}; {moved} moved, but both nights resolved as of {bad_day}: no days to bisect"
        )
    # The packages that moved take each day's newest release (within their spec where it floats);
    # the others stay at tonight's versions.
    hold = tuple(name for name in base.packages if name not in candidate.moved)
    base = dataclasses.replace(
        base,
        packages={name: spec if name in hold else planned.cell.packages[name] for name, spec in base.packages.items()},
    )
    ctx.console.print(
        f"{after.id.label()}: {moved} moved; bisecting the days {good_day} .. {bad_day}, holding {', '.join(hold)}",
        highlight=False,
    )
    opts = BisectOptions(
        run=bisect_run(ctx, item_dir(ctx, after) / "bisect-days"),
        repro=after.repro,
        mode=after.mode,
        package=None,
        good=good_day,
        bad=bad_day,
        by_date=True,
        hold=hold,
        base=base,
    )
    report = _bisect(ctx, candidate, opts)
    if isinstance(report, str):
        return _change(candidate, verdict, f"{reason}; {moved} moved, and the days could not be bisected: {report}")
    evidence: dict[str, object] = {"bisect": report.directory, "final": report.final, "steps": len(report.steps)}
    if report.status != FOUND or report.boundary is None:
        return _judged(candidate, report, "", verdict, reason, evidence)
    day = report.boundary
    that_day = report.moved_on_boundary
    evidence["day"] = day
    evidence["moved_that_day"] = {k: list(v) for k, v in that_day.items()}
    if len(that_day) != 1:
        return one_at_a_time(ctx, candidate, report, day, that_day, verdict, reason, evidence)
    (package, (older, newer)), *_ = that_day.items()
    # The old outcome is on the good (previous night's) side of the day.
    last, first = (older, newer) if report.kind == "regression" else (newer, older)
    if last is None or first is None:
        return _change(candidate, verdict, f"{reason}; on {day} {package} {last} -> {first}", evidence=evidence)
    try:
        releases = released_versions(package, pre=True)
        lo, hi = sorted((Version(last), Version(first)))
        inside = [v for v in between(releases, lo, hi, pre=True) if lo < v < hi]
    except (VersionsUnavailable, InvalidVersion):
        inside = []
    if not inside:
        culprit = Culprit(package=package, last=last, first=first)
        return _change(
            candidate,
            verdict,
            f"{reason}; the outcome changed on {day}, when only {package} moved, {last} -> {first} "
            "(no release between them)",
            culprit=culprit,
            evidence=evidence,
        )
    resolved = (report.resolutions or {}).get(day) or {}
    day_base = pinned_to_tonight(ctx, after, versions={**ctx.tonight.installed(after), **resolved})
    found = by_release(ctx, candidate, package, last, first, day_base)
    return found.model_copy(update={"evidence": {**evidence, **found.evidence}})


def one_at_a_time(
    ctx: WatchContext,
    candidate: Candidate,
    report: BisectReport,
    day: str,
    that_day: dict[str, tuple[str | None, str | None]],
    verdict: str,
    reason: str,
    evidence: dict[str, object],
) -> Change:
    """Several packages moved on the day the outcome changed: move each alone, from the day
    before (the cell's own packages first), the others as they were; the one whose move alone
    shows the new outcome is the culprit. None does: they changed it together, no culprit."""
    after = candidate.after
    planned = ctx.planned.get(after.key)
    before_day = str(dt.date.fromisoformat(day) - dt.timedelta(days=1))
    old_side = before_day if report.kind == "regression" else day
    old_lock = dict(line.split("==", 1) for line in (report.locks or {}).get(old_side, []))
    together = ", ".join(f"{n} {a or '-'} -> {b or '-'}" for n, (a, b) in that_day.items()) or "nothing"
    if planned is None or not old_lock:
        return _change(
            candidate, verdict, f"{reason}; on {day} {together} moved together: no one culprit", evidence=evidence
        )
    cell = planned.cell
    ordered = sorted(that_day, key=lambda n: (n not in cell.packages, n))
    tried: dict[str, str] = {}
    for package in ordered:
        older, newer = that_day[package]
        last, first = (older, newer) if report.kind == "regression" else (newer, older)
        if first is None or last is None:
            continue
        pins = {n: f"=={old_lock[n]}" for n in cell.packages if n in old_lock}
        pins[package] = f"=={first}"
        # The rest as it resolved by the end of the old side's day: the package's own needs exempted.
        probe = dataclasses.replace(
            cell,
            name=f"{cell.name}@{old_side}+{package}-{first}",
            packages=pins,
            lock=None,
            as_of=str(dt.date.fromisoformat(old_side) + dt.timedelta(days=1)),
            origin=cell.origin or cell.name,
        )
        ctx.console.print(f"{after.id.label()}: on {day}, {package} {last} -> {first} alone", highlight=False)
        observed = probe_item(ctx, planned, probe, item_dir(ctx, after) / f"alone-{package}")
        tried[package] = str(observed.outcome) if observed is not None else "not run"
        if observed is not None and _signature(observed) == _signature(after):
            evidence["alone"] = tried
            return _change(
                candidate,
                verdict,
                f"{reason}; the outcome changed on {day}, when {together} moved; {package} {last} -> {first} "
                "alone shows it",
                culprit=Culprit(package=package, last=last, first=first),
                evidence=evidence,
            )
    evidence["alone"] = tried
    return _change(
        candidate,
        verdict,
        f"{reason}; the outcome changed on {day}, when {together} moved, and no one of them alone shows it "
        f"(range left: {day})",
        evidence=evidence,
    )


def probe_item(ctx: WatchContext, planned: PlannedItem, cell: Cell, out: Path) -> ItemRecord | None:
    """Run the item once in ``cell`` (a run of its own under ``out``); its record, or None."""
    opts = dataclasses.replace(
        ctx.run,
        attempts=AttemptPolicy(),
        stack=ctx.run.stack.evolve(pins=()),
        selection=ctx.run.selection.evolve(shard=None),
        out_dir=out,
        explore=True,
        save_expectations=False,
    )
    plan = Plan(items=[dataclasses.replace(planned, cell=cell)])
    RunSession(opts, ctx.console, ["watch", "probe"], None, plan=plan, kind="watch-probe").execute()
    records = RunDir(out).records()
    return records[0] if records else None


def bisect_run(ctx: WatchContext, out: Path) -> RunOptions:
    """Tonight's options for a bisect of a change: its own directory, the base cell given whole (the
    bisect holds it, so neither ``--pin`` nor ``--as-of`` is applied to it again)."""
    return dataclasses.replace(
        ctx.run,
        stack=ctx.run.stack.evolve(pins=(), as_of=None),
        selection=ctx.run.selection.evolve(shard=None),
        out_dir=out,
    )


def classify_all(ctx: WatchContext, candidates: Sequence[Candidate]) -> list[Change]:
    return [classify(ctx, c) for c in candidates]
