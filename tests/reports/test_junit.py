"""JUnit XML: one testcase per item, failures carry the signature and message."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from junitparser import Failure, JUnitXml, Skipped

from harness.records.item import ItemRecord
from harness.records.run_meta import ExcludedItem
from harness.reports.junit import write_junit


def item(**fields: Any) -> ItemRecord:
    """A record with ``fields``; what the JUnit file does not show is left at its emptiest."""
    return ItemRecord.model_validate(
        {
            "schema_version": 1,
            "run_id": "run-1",
            "signature": None,
            "expected": None,
            "versions": {},
            "world_size": 2,
            "device": "cpu",
            "error": None,
            "reasons": [],
            "guards": [],
            "env": None,
            "repro_cmd": "",
            "started_at": "2026-11-20T10:00:00+00:00",
            "finished_at": "2026-11-20T10:00:01+00:00",
            **fields,
        }
    )


def test_one_testcase_per_item_with_failures_and_skips(tmp_path: Path) -> None:
    records = [
        item(cell="current", repro="F1", mode="bug", outcome="NOT_REPRODUCED", matched=True, wall_s=20.5),
        item(
            **{
                "cell": "old",
                "repro": "F1",
                "mode": "bug",
                "outcome": "DIFFERENT_ERROR",
                "matched": False,
                "expected": "REPRODUCED",
                "signature": None,
                "wall_s": 12.0,
                "error": {"type": "RuntimeError", "message": "<b>boom</b> & more", "rank": 1},
                "reasons": [],
                "repro_cmd": "python -m harness run --cells old",
            }
        ),
    ]
    excluded = [ExcludedItem(cell="old", repro="F5", mode="fixed", reason="needs two GPUs")]
    path = tmp_path / "junit.xml"
    write_junit(path, "run-1", records, excluded)
    suite = next(iter(JUnitXml.fromfile(str(path))))
    cases = {f"{c.classname}::{c.name}": c for c in suite}
    assert set(cases) == {"current::F1/bug", "old::F1/bug", "old::F5/fixed"}
    assert cases["current::F1/bug"].is_passed
    (failure,) = cases["old::F1/bug"].result
    assert isinstance(failure, Failure)
    assert failure.message == "observed DIFFERENT_ERROR, expected REPRODUCED" and failure.type == "RuntimeError"
    assert "<b>boom</b> & more" in failure.text and "rerun: python -m harness run --cells old" in failure.text
    assert isinstance(cases["old::F5/fixed"].result[0], Skipped)
    assert suite.failures == 1 and suite.skipped == 1 and suite.tests == 3


CONTROL = "\x1b[31mred\x1b[0m \x00nul \x07bell \x1b]0;title\x07 \ud800"


def test_control_characters_in_a_message_are_written_as_escapes_and_the_xml_parses(tmp_path: Path) -> None:
    record = item(
        **{
            "cell": "c\x1b",
            "repro": "F1",
            "mode": "bug",
            "outcome": "DIFFERENT_ERROR",
            "matched": False,
            "expected": "REPRODUCED",
            "signature": None,
            "wall_s": 1.0,
            "error": {"type": "RuntimeError", "message": CONTROL, "rank": 0},
            "reasons": [CONTROL],
            "repro_cmd": "rerun",
        }
    )
    path = tmp_path / "junit.xml"
    write_junit(path, "run-\x1b", [record], [ExcludedItem(cell="c", repro="F2", mode="bug", reason=CONTROL)])
    suite = next(iter(JUnitXml.fromfile(str(path))))
    (failure,) = next(c for c in suite if c.name == "F1/bug").result
    assert "\\x1b[31mred\\x1b[0m \\x00nul \\x07bell" in failure.text and "\x1b" not in path.read_text()
