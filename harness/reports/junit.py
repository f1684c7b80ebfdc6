"""JUnit XML for CI systems: one testcase per item (metrics stay in results.jsonl).

classname is the cell, name is ``repro/mode``; an item fails when its observation
did not match its expectation (a ``watch`` run adds a second suite, one testcase per change, failed
where it regressed), the failure carrying the outcome (what it means, from the outcome table, first), the signature or
error type, and the message; excluded items are skipped with their reason. An item run again
(``--reruns``) carries its earlier attempts as surefire's ``flakyFailure`` (it matched on a rerun)
or ``rerunFailure`` (it never did) elements, which Jenkins and GitLab show as flaky.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import junitparser
from junitparser import Failure, JUnitXml, Skipped, TestSuite
from junitparser.xunit2 import FlakyFailure, RerunFailure, TestCase

from harness.core.text import plain
from harness.records.changes import REGRESSED, Change
from harness.records.item import Attempt, ItemRecord, counts_text
from harness.records.run_meta import ExcludedItem
from harness.reports.changes_summary import culprit_text, moved_text
from harness.reports.finished import FinishedRun
from harness.reports.outcome_table import shown
from repros.runtime.outcomes import Outcome

OUTCOMES = frozenset(Outcome)

JUNIT_FILE = "junit.xml"


def _text(value: object) -> str:
    """Run text as XML can hold it: control characters (an ANSI escape, a NUL) shown as escapes."""
    return plain(str(value))


def _named(outcome: str | None) -> str | None:
    """An outcome as the outcome table names it."""
    return shown(outcome).name if outcome in OUTCOMES else outcome


def _interim_attempts(record: ItemRecord) -> list[Attempt]:
    """What JUnit lists as interim results: ``--reruns``' earlier attempts; ``--repeat``'s attempts
    that did not end as expected, where the attempts disagreed (FLAKY)."""
    if record.repeat is None:
        return record.attempts
    if record.outcome != Outcome.FLAKY:
        return []
    return [a for a in record.attempts if a.outcome != record.expected]


def _case(record: ItemRecord) -> TestCase:
    case = TestCase(_text(f"{record.repro}/{record.mode}"), classname=_text(record.cell), time=record.wall_s)
    if record.outcome_counts:
        case.system_out = _text(f"{record.repeat} attempts: {counts_text(record.outcome_counts)}")
    for attempt in _interim_attempts(record):
        kind = FlakyFailure if record.matched else RerunFailure
        interim = kind(
            _text(f"observed {_named(attempt.outcome)}, expected {_named(record.expected)}"),
            _text(attempt.signature or attempt.error_type),
        )
        interim.text = _text(f"{attempt.error_type}: {attempt.message}\nkept in {attempt.item_dir}")
        case.add_interim_result(interim)
    if not record.counts_against:
        return case  # matched, or an explored item's finding
    error = record.error
    expected = _named(record.expected) or "no expectation for these versions"
    observed = shown(record.outcome)
    failure = Failure(
        _text(f"observed {observed.name}, expected {expected}"),
        _text(record.signature or (error.type if error else None)),
    )
    # What the outcome means first (the outcome table's legend), then what the item said.
    details = [f"{observed.name}: {observed.legend}"]
    details += [f"{error.type}: {error.message}"] if error else []
    details += list(record.reasons)
    details.append(f"rerun: {record.repro_cmd}")
    if error and error.traceback:
        details.append(f"traceback (rank {error.rank}):\n{error.traceback}")
    failure.text = _text("\n".join(details))
    case.result = [failure]
    return case


def _change_case(change: Change) -> TestCase:
    """A watch change: a failure where it regressed, passed (with what happened) otherwise."""
    case = TestCase(_text(f"{change.repro}/{change.mode}"), classname=_text(f"watch.{change.cell}"))
    culprit = f"; culprit {culprit_text(change)}" if change.culprit else ""
    summary = f"{change.before} -> {change.after}: {change.verdict}{culprit}; moved: {moved_text(change)}"
    if change.verdict == REGRESSED:
        failure = Failure(_text(f"regressed: {change.before} -> {change.after}"), _text(change.after_signature))
        failure.text = _text(f"{summary}\n{change.reason}")
        case.result = [failure]
    else:
        case.system_out = _text(f"{summary}\n{change.reason}")
    return case


def write_junit(
    path: Path,
    run_id: str,
    records: Sequence[ItemRecord],
    excluded: Sequence[ExcludedItem] = (),
    changes: Sequence[Change] | None = None,
) -> None:
    suite = TestSuite(_text(f"ft-regress {run_id}"))
    cases: list[junitparser.TestCase] = [_case(record) for record in records]
    for item in excluded:
        case = TestCase(_text(f"{item.repro}/{item.mode}"), classname=_text(item.cell))
        case.result = [Skipped(_text(f"excluded: {item.reason}"))]
        cases.append(case)
    # All at once: ``add_testcase`` counts every case again at each one (quadratic in the items).
    suite.add_testcases(cases)
    xml = JUnitXml()
    xml.add_testsuite(suite)
    if changes is not None:
        watched = TestSuite(_text(f"ft-regress watch {run_id}"))
        changed: list[junitparser.TestCase] = [_change_case(change) for change in changes]
        watched.add_testcases(changed)
        xml.add_testsuite(watched)
    tmp = path.with_suffix(".xml.tmp")
    xml.write(str(tmp), pretty=True)
    tmp.replace(path)


def write(run: FinishedRun) -> Path:
    """The run's ``junit.xml`` (a ``finalize`` report writer)."""
    path = run.dir.path / JUNIT_FILE
    run_id = run.meta.run_id or (run.records[0].run_id if run.records else "") or "run"
    write_junit(path, run_id, run.records, run.excluded, run.changes)
    return path
