"""``results.jsonl``: one record per line, appended as each item finishes, never lost.

A record is written with as many ``write`` calls as it takes and flushed to disk, so an
interrupted run keeps every record it finished, whole. Before anything is appended, a torn
last line (a crash or a full disk mid-write) is set aside to ``results.jsonl.torn`` and cut
from the file, so the next record never glues onto a fragment. A write that fails (a full
disk) is undone to the last whole line and raised as ``ResultsWriteError``: the run stops
cleanly, keeping what was written.

Reading is strict about what a line is (``harness.records.item.parse_record``): a line that is
not a record of a known schema (an outcome that does not exist, a field of the wrong type) makes
the file unreadable, with the line number and the field, except a torn last line (its writer was
killed mid-write, or is still appending): it is not a record, and never dropped in silence either.
``Records.torn`` says which line it is and, where the fragment still names them, which item it
was, so ``compare``, ``merge``, ``watch`` and ``report`` say "torn" where they would otherwise show
the item as removed or not run. Readers of other runs' files (the history, the shards' balance)
read leniently: such a line is left out and named, never trusted; a file with more than
``MOST_LINES_LEFT_OUT`` such lines is no run's results at all, and is left out whole, in one line,
without reading the rest of it. A record that repeats an item of the same run (cell, repro, mode,
run id) is counted once, the last whole one, and said.
"""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.core.errors import UserError
from harness.core.user_files import open_named
from harness.records.item import ItemId, ItemRecord, RecordError, parse_record

RESULTS_FILE = "results.jsonl"
TORN_SUFFIX = ".torn"
#: A lenient reader (another run's file) names each line it leaves out, up to this many; a file
#: with more is not a run's results (a corrupt or foreign file) and is left out whole, unread past
#: that point, in one line.
MOST_LINES_LEFT_OUT = 20
#: The longest line read as a record (a record is kilobytes; its ranks' log tails are capped): a
#: longer one is not a record, and its rest is skipped unread into memory.
MAX_LINE_BYTES = 64 * 2**20


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
    """(line number, the line, whether it is the last one and has no newline), one line at a time;
    a line longer than ``MAX_LINE_BYTES`` is cut there (its rest skipped unread). Opened as every file a user
    names is (a device, or a named pipe that gives nothing, refused)."""
    with open_named(path, "", "pass the directory of an ft-regress run") as fh:
        number = 0
        while True:
            line = fh.readline(MAX_LINE_BYTES)
            if not line:
                return
            number += 1
            if not line.endswith(b"\n") and len(line) == MAX_LINE_BYTES:
                while True:  # the rest of an overlong line: skipped, never held
                    rest = fh.readline(MAX_LINE_BYTES)
                    if not rest or rest.endswith(b"\n"):
                        break
                yield number, line, False
                continue
            yield number, line.rstrip(b"\n"), not line.endswith(b"\n")


#: How a record names its item, as ``ResultsWriter`` writes it (``json.dumps``: a string's quotes
#: and backslashes escaped), for a torn line whose fragment still holds them.
_ITEM_FIELD = {name: re.compile(rf'"{name}": "((?:[^"\\]|\\.)*)"') for name in ("cell", "repro", "mode")}


def _item_of_fragment(fragment: bytes) -> ItemId | None:
    """The item a torn line was the record of, where the fragment still names it (else None)."""
    text = fragment.decode("utf-8", errors="replace")
    found = {}
    for name, pattern in _ITEM_FIELD.items():
        match = pattern.search(text)
        if match is None:
            return None
        try:
            found[name] = json.loads(f'"{match[1]}"')
        except ValueError:
            return None
    return ItemId(found["cell"], found["repro"], found["mode"])


@dataclass(frozen=True)
class TornLine:
    """A results file's last line cut short: a record its writer never finished (killed mid-write),
    or one it is still writing. Not a record; said wherever the file is read."""

    path: Path
    line: int
    size: int
    #: The item it was the record of, where the fragment still names it.
    item: ItemId | None = None

    def describe(self) -> str:
        what = f"the record of {self.item.label()}" if self.item is not None else "a record"
        return (
            f"{self.path}: line {self.line} is torn: {what}, cut short after {self.size} bytes (a run killed "
            "while writing it, or one still writing)"
        )


class Records(list[ItemRecord]):
    """A results file's records, each item of each run once, and what reading it said.

    ``duplicates``: a line for each record that repeated an earlier one of the same item of the
    same run (cell, repro, mode, run id): the last whole one is counted, in the first one's place.
    ``skipped``: a line for each line a lenient reader left out (the history, a shard's balance),
    naming the line and what is wrong with it. ``torn``: the last line, where it is a record cut
    short (``TornLine``): not counted, and said by every reader.
    """

    def __init__(
        self,
        records: Iterable[ItemRecord] = (),
        duplicates: Sequence[str] = (),
        skipped: Sequence[str] = (),
        torn: TornLine | None = None,
    ):
        super().__init__(records)
        self.duplicates = list(duplicates)
        self.skipped = list(skipped)
        self.torn = torn


def torn_line(records: Sequence[ItemRecord]) -> TornLine | None:
    """The torn last line reading ``records`` met, if any (None for a plain list of records)."""
    return records.torn if isinstance(records, Records) else None


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
    torn last line is not a record: ``Records.torn`` says so. Anything else that is not a record
    raises ``UserError`` naming the file, the line and what is wrong (an outcome that does not
    exist, a field of the wrong type); with ``lenient``, such a line is left out and named in
    ``skipped`` instead (another run's file, read for the history or the shards' balance, never
    stops this run's report), and a file with more than ``MOST_LINES_LEFT_OUT`` of them raises
    ``UserError`` in one line: it is no run's results."""
    found: dict[tuple[str, str, str, str], tuple[int, ItemRecord]] = {}
    duplicates: list[str] = []
    skipped: list[str] = []
    torn: TornLine | None = None
    try:
        for number, raw, last in _lines(path):
            text = raw.strip()
            if not text:
                continue
            value, problem = _decode(text)
            if problem is not None:
                if last:
                    # A torn last line: its writer died (or is still) mid-write.
                    torn = TornLine(path, number, len(raw), _item_of_fragment(raw))
                    continue
                if lenient:
                    _leave_out(path, skipped, f"line {number}: {problem}", number)
                    continue
                raise UserError(path, f"line {number}", problem, "restore the file from the run, or remove that line")
            try:
                record = parse_record(value)
            except RecordError as exc:
                if lenient:
                    _leave_out(path, skipped, f"line {number}: {exc}", number)
                    continue
                raise UserError(path, f"line {number}", str(exc), "pass the results of an ft-regress run") from None
            _count(path, number, record, found, duplicates)
    except IsADirectoryError:
        raise UserError(path, "", "is a directory, not a results file", "pass the run's directory") from None
    except OSError as exc:
        raise UserError(path, "", f"cannot be read ({exc.strerror})", "check the path and its permissions") from None
    return Records((record for _, record in found.values()), duplicates, skipped, torn)


def _leave_out(path: Path, skipped: list[str], why: str, number: int) -> None:
    """Name a line a lenient reader leaves out; past ``MOST_LINES_LEFT_OUT`` of them, the file is no
    run's results: one line for all of it (and nothing more of it is read)."""
    if len(skipped) >= MOST_LINES_LEFT_OUT:
        raise UserError(
            path,
            "",
            f"is not a run's results: more than {MOST_LINES_LEFT_OUT} of its lines are not records, read up to "
            f"line {number} (the first: {skipped[0].removeprefix(f'{path}: ')})",
            "move it out of the reports directory, or restore it from the run",
        )
    skipped.append(f"{path}: {why}")


def _count(
    path: Path,
    number: int,
    record: ItemRecord,
    found: dict[tuple[str, str, str, str], tuple[int, ItemRecord]],
    duplicates: list[str],
) -> None:
    """Keep ``record`` as its item's (of its run): the last whole one, where an item repeats, said."""
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
