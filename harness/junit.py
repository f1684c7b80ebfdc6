"""JUnit XML for CI systems: one testcase per item (metrics stay in results.jsonl).

classname is the cell, name is ``repro/mode``; an item fails when its observation
did not match its expectation, the failure carrying the outcome, the signature or
error type, and the message; excluded items are skipped with their reason. An item run again
(``--reruns``) carries its earlier attempts as surefire's ``flakyFailure`` (it matched on a rerun)
or ``rerunFailure`` (it never did) elements, which Jenkins and GitLab show as flaky.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from junitparser import Failure, JUnitXml, Skipped, TestSuite
from junitparser.xunit2 import FlakyFailure, RerunFailure, TestCase

from harness.records import ItemRecord, counts_against
from harness.terminal import plain

if TYPE_CHECKING:
    from harness.finalize import FinishedRun

JUNIT_FILE = "junit.xml"


def _text(value: object) -> str:
    """Run text as XML can hold it: control characters (an ANSI escape, a NUL) shown as escapes."""
    return plain(str(value))


def _case(record: ItemRecord) -> TestCase:
    case = TestCase(
        _text(f"{record['repro']}/{record['mode']}"), classname=_text(record["cell"]), time=record.get("wall_s") or 0.0
    )
    for attempt in record.get("attempts") or []:
        kind = FlakyFailure if record.get("matched") else RerunFailure
        interim = kind(
            _text(f"observed {attempt['outcome']}, expected {record.get('expected')}"),
            _text(attempt.get("signature") or attempt.get("error_type")),
        )
        interim.text = _text(
            f"{attempt.get('error_type')}: {attempt.get('message')}\nkept in {attempt.get('item_dir')}"
        )
        case.add_interim_result(interim)
    if not counts_against(record):
        return case  # matched, or an explored item's finding
    error = record.get("error") or {}
    expected = record.get("expected") or "no expectation for these versions"
    failure = Failure(
        _text(f"observed {record['outcome']}, expected {expected}"),
        _text(record.get("signature") or error.get("type")),
    )
    details = [f"{error.get('type')}: {error.get('message')}"] if error else []
    details += list(record.get("reasons") or [])
    details.append(f"rerun: {record.get('repro_cmd')}")
    if error.get("traceback"):
        details.append(f"traceback (rank {error.get('rank')}):\n{error['traceback']}")
    failure.text = _text("\n".join(details))
    case.result = [failure]
    return case


def write_junit(
    path: Path, run_id: str, records: Sequence[ItemRecord], excluded: Sequence[dict[str, Any]] = ()
) -> None:
    suite = TestSuite(_text(f"ft-regress {run_id}"))
    for record in records:
        suite.add_testcase(_case(record))
    for item in excluded:
        case = TestCase(_text(f"{item['repro']}/{item['mode']}"), classname=_text(item["cell"]))
        case.result = [Skipped(_text(f"excluded: {item['reason']}"))]
        suite.add_testcase(case)
    xml = JUnitXml()
    xml.add_testsuite(suite)
    tmp = path.with_suffix(".xml.tmp")
    xml.write(str(tmp), pretty=True)
    tmp.replace(path)


def write(run: FinishedRun) -> Path:
    """The run's ``junit.xml`` (a ``finalize`` report writer)."""
    path = run.dir.path / JUNIT_FILE
    run_id = str(run.meta.get("run_id") or (run.records[0].get("run_id") if run.records else "") or "run")
    write_junit(path, run_id, run.records, run.excluded)
    return path
