"""``results.jsonl``: one record per line, appended as each item finishes, never lost.

A record is written with as many ``write`` calls as it takes and flushed to disk, so an
interrupted run keeps every record it finished, whole. Before anything is appended, a torn
last line (a crash or a full disk mid-write) is set aside to ``results.jsonl.torn`` and cut
from the file, so the next record never glues onto a fragment. A write that fails (a full
disk) is undone to the last whole line and raised as ``ResultsWriteError``: the run stops
cleanly, keeping what was written.

Reading is strict about what a line is (``harness.records.item.parse_record``): a line that is
not a record of a known schema (an outcome that does not exist, a field of the wrong type) makes
the file unreadable, with the line number and the field, except a torn last line, which a reader
skips (its writer may still be appending). Readers of other runs' files (the history, the shards'
balance) read leniently: such a line is left out and named, never trusted. A record that repeats
an item of the same run (cell, repro, mode, run id) is counted once, the last whole one, and said.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from harness.core.errors import UserError
from harness.records.item import ItemRecord, RecordError, parse_record

RESULTS_FILE = "results.jsonl"
TORN_SUFFIX = ".torn"


class ResultsWriteError(Exception):
    """A record could not be written whole (the file is left ending with the last whole record)."""


def _ends_torn(path: Path) -> int | None:
    """The length of the file up to its last newline, where bytes follow it; else None."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return None
    if size == 0:
        return None
    with open(path, "rb") as fh:
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return None
        # Walk back to the last newline.
        position = size
        while position > 0:
            step = min(65536, position)
            fh.seek(position - step)
            chunk = fh.read(step)
            found = chunk.rfind(b"\n")
            if found >= 0:
                return position - step + found + 1
            position -= step
        return 0


def repair(path: Path) -> str | None:
    """Set a torn last line aside (``<file>.torn``) and cut it off; return the fragment set aside."""
    whole = _ends_torn(path)
    if whole is None:
        return None
    with open(path, "rb") as fh:
        fh.seek(whole)
        fragment = fh.read()
    with open(path.with_name(path.name + TORN_SUFFIX), "ab") as aside:
        aside.write(fragment + b"\n")
        aside.flush()
        os.fsync(aside.fileno())
    os.truncate(path, whole)
    return fragment.decode("utf-8", errors="replace")


class ResultsWriter:
    """Appends records to ``results.jsonl``, one whole line at a time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        #: A torn last line found (and set aside) when the file was opened.
        self.repaired = repair(path)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def append(self, record: ItemRecord) -> None:
        line = (json.dumps(record.as_json(), sort_keys=True) + "\n").encode("utf-8")
        start = os.fstat(self._fd).st_size
        written = 0
        try:
            while written < len(line):
                n = os.write(self._fd, line[written:])
                if n <= 0:
                    raise OSError(errno.EIO, "write returned no progress")
                written += n
            os.fsync(self._fd)
        except OSError as exc:
            # Undo the partial line: the file ends with the last whole record.
            try:
                os.ftruncate(self._fd, start)
            except OSError:
                pass
            raise ResultsWriteError(f"{self.path}: could not write a record ({exc.strerror or exc})") from exc

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> ResultsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _lines(path: Path) -> Iterator[tuple[int, bytes, bool]]:
    """(line number, the line, whether it is the last one and has no newline)."""
    with open(path, "rb") as fh:
        data = fh.read()
    parts = data.split(b"\n")
    for number, part in enumerate(parts, 1):
        last = number == len(parts)
        if last and not part:
            break
        yield number, part, last


class Records(list[ItemRecord]):
    """A results file's records, each item of each run once, and what reading it said.

    ``duplicates``: a line for each record that repeated an earlier one of the same item of the
    same run (cell, repro, mode, run id): the last whole one is counted, in the first one's place.
    ``skipped``: a line for each line a lenient reader left out (the history, a shard's balance),
    naming the line and what is wrong with it.
    """

    def __init__(self, records: Iterable[ItemRecord] = (), duplicates: Sequence[str] = (), skipped: Sequence[str] = ()):
        super().__init__(records)
        self.duplicates = list(duplicates)
        self.skipped = list(skipped)


def _decode(raw: bytes) -> tuple[object, str | None]:
    """A line's JSON value, or why it has none (a value Python's JSON reader refuses, too deep
    or a number of too many digits, is not JSON here either)."""
    try:
        return json.loads(raw.decode("utf-8")), None
    except UnicodeDecodeError:
        return None, "is not UTF-8 text"
    except (ValueError, RecursionError):
        return None, "is not JSON"


def read_results(path: Path, *, lenient: bool = False) -> Records:
    """Every record in a results file, each item of a run once (the last whole record of it); a
    torn last line is skipped. Anything else that is not a record raises ``UserError`` naming the
    file, the line and what is wrong (an outcome that does not exist, a field of the wrong type);
    with ``lenient``, such a line is left out and named in ``skipped`` instead (another run's
    file, read for the history or the shards' balance, never stops this run's report)."""
    try:
        lines = list(_lines(path))
    except IsADirectoryError:
        raise UserError(path, "", "is a directory, not a results file", "pass the run's directory") from None
    except OSError as exc:
        raise UserError(path, "", f"cannot be read ({exc.strerror})", "check the path and its permissions") from None
    found: dict[tuple[str, str, str, str], tuple[int, ItemRecord]] = {}
    duplicates: list[str] = []
    skipped: list[str] = []
    for number, raw, last in lines:
        text = raw.strip()
        if not text:
            continue
        value, problem = _decode(text)
        if problem is not None:
            if last:
                continue  # a torn last line: its writer died (or is still) mid-write
            if lenient:
                skipped.append(f"{path}: line {number}: {problem}")
                continue
            raise UserError(path, f"line {number}", problem, "restore the file from the run, or remove that line")
        try:
            record = parse_record(value)
        except RecordError as exc:
            if lenient:
                skipped.append(f"{path}: line {number}: {exc}")
                continue
            raise UserError(path, f"line {number}", str(exc), "pass the results of an ft-regress run") from None
        key = (record.run_id, *record.key)
        if key in found:
            first = found[key][0]
            duplicates.append(
                f"{path}: line {number} records {record.id.label()} of run {record.run_id} again "
                f"(also line {first}): counted once, as line {number} says"
            )
            found[key] = (first, record)
        else:
            found[key] = (number, record)
    return Records((record for _, record in found.values()), duplicates, skipped)
