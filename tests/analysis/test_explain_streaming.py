"""``explain`` reads the whole log, line by line: a failure early in a big CI log is named, with the
line number ``grep -n`` gives it, from a file or from standard input, in bounded memory."""

from __future__ import annotations

import io
import itertools
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.analysis.explain import logs
from harness.analysis.explain.logs import MAX_LINE_BYTES, log_lines, logged_errors, open_log, scan_log
from repros.runtime.signatures import CHECKPOINT_ERROR
from tests.analysis.test_explain import RECORDED, traceback_of
from tests.support.paths import REPO_ROOT

CI_LOG = (RECORDED / "f1_torchrun_ci_log_plain_script_deepspeed-0.19.2.log").read_bytes()
#: Where F1's exception line is in the recorded CI log.
F1_LINE_IN_CI_LOG = 40
MIB = 1024 * 1024
#: What comes before the failure: a progress bar a terminal rewrote with carriage returns, a form
#: feed, a line separator: none of them starts a line for grep or an editor.
PREAMBLE = [
    b"Downloading model: 10%|#         |\r Downloading model: 60%|######    |\r Downloading model: 100%|##########|",
    b"page one\x0cpage two",
    "configuration \u2028 continued \x85 and \x1c".encode(),
] * 50


def big_log(path: Path, size: int = 200 * MIB) -> int:
    """A ``size``-byte CI log with F1's traceback near its start, then noise (training records,
    then a sparse tail of NUL bytes with no newline); return F1's exception line's number."""
    noise = b"".join(
        b"[2026-11-23 18:45:%02d,000] [INFO] step %d loss 0.%04d\n" % (i % 60, i, i) for i in range(20_000)
    )
    with open(path, "wb") as fh:
        fh.write(b"\n".join(PREAMBLE) + b"\n")
        fh.write(CI_LOG)
        fh.write(noise)
        fh.truncate(size)
    return len(PREAMBLE) + F1_LINE_IN_CI_LOG


def explain_cli(*args: str, stdin: object = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness", "explain", *args],
        stdin=stdin,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_failure_at_the_start_of_a_200_mb_log_is_named_with_its_line_from_a_file_and_stdin(tmp_path: Path) -> None:
    log = tmp_path / "ci.log"
    line = big_log(log)
    assert log.stat().st_size == 200 * MIB
    done = explain_cli(str(log))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("F1: "), done.stdout
    assert f"matched F1.recompute-shape-0 on log line {line}, 2 ranks" in done.stdout, done.stdout
    with open(log, "rb") as fh:
        piped = explain_cli("-", stdin=fh)
    assert piped.returncode == 0, piped.stdout + piped.stderr
    assert f"matched F1.recompute-shape-0 on log line {line}, 2 ranks" in piped.stdout, piped.stdout


def test_reading_a_200_mb_log_keeps_memory_bounded(tmp_path: Path) -> None:
    log = tmp_path / "ci.log"
    line = big_log(log)
    tracemalloc.start()
    try:
        with open_log(str(log)) as lines:
            scan = scan_log(lines)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [(e.type, e.line) for e in scan.errors][:1] == [(CHECKPOINT_ERROR, line)]
    assert peak < 4 * MIB, f"peak {peak / MIB:.1f} MiB reading a 200 MiB log"


def test_a_line_longer_than_the_limit_is_cut_and_the_next_line_keeps_its_number() -> None:
    long_line = b"x" * (3 * MAX_LINE_BYTES + 17) + b"\n"
    data = long_line + traceback_of("ZeroDivisionError", "division by zero").encode()
    lines = list(log_lines(io.BytesIO(data)))
    assert len(lines[0]) == MAX_LINE_BYTES and lines[1].startswith("Traceback")
    (error,) = scan_log(iter(lines)).errors
    assert (error.type, error.line) == ("ZeroDivisionError", 8)


NOISE_CHARS = st.characters(codec="utf-8", exclude_categories=("Cs",), exclude_characters="\n") | st.sampled_from(
    "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
)


@settings(max_examples=60, deadline=None)
@given(
    noise=st.lists(st.text(NOISE_CHARS, max_size=40).filter(lambda s: ":" not in s), max_size=30),
    crlf=st.booleans(),
)
def test_the_line_number_is_the_one_grep_gives_whatever_comes_before(noise: list[str], crlf: bool) -> None:
    end = "\r\n" if crlf else "\n"
    failure = traceback_of("ZeroDivisionError", "division by zero").replace("\n", end)
    text = "".join(line + end for line in noise) + failure
    expected = len(noise) + 7  # the traceback's exception line is its 7th
    assert text.split("\n")[expected - 1].startswith("ZeroDivisionError")  # what grep -n says
    from_bytes = scan_log(log_lines(io.BytesIO(text.encode()))).errors
    assert [(e.type, e.line) for e in from_bytes if e.type == "ZeroDivisionError"] == [("ZeroDivisionError", expected)]
    assert [e.line for e in logged_errors(text) if e.type == "ZeroDivisionError"] == [expected]


def test_many_distinct_exceptions_are_kept_up_to_a_bound_and_the_rest_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logs, "MAX_ERRORS", 50)
    lines = (f"ValueError: bad value {i}" for i in range(5000))
    scan = scan_log(lines)
    assert len(scan.errors) == 50 and scan.not_kept == 4950 and scan.lines == 5000
    assert scan.errors[0].line == 1


def test_a_traceback_after_a_long_stream_of_noise_is_read_in_order() -> None:
    noise = (f"[2026-11-23 18:45:00,000] [INFO] step {i}" for i in range(200_000))
    failure = traceback_of("ZeroDivisionError", "division by zero").split("\n")
    scan = scan_log(itertools.chain(noise, failure))
    assert [(e.type, e.line) for e in scan.errors] == [("ZeroDivisionError", 200_007)]
