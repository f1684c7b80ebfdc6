"""The exceptions in a traceback or a CI log: their type, their whole message, and where they are.

A log interleaves streams: torchrun prefixes each rank's lines (``[rank0]: ``, ``[default1]:``),
CI runners prefix timestamps, terminals leave colour codes. Each line is stripped of those and
assigned to its stream, and each stream is read on its own: after ``Traceback (most recent call
last):`` come the indented frames, then the exception line ``module.Type: message``, whose message
runs on until the next traceback, a chained-exception line or a new log record. A stream with no
traceback header (a truncated log) is scanned for lines that look like an exception line. The
same exception raised by several ranks is reported once, with how many streams showed it.

A log where nothing was raised may still show a failure in the metrics it logged: a gradient norm that is
not finite beside a finite loss, DeepSpeed's count of skipped steps (``symptoms.py``); each such symptom is
reported as the exception a harness run raises for it.

The log is read as a stream, line by line, from its first line to its last (a file, or ``-``:
standard input), never whole: memory stays bounded whatever its size (a line longer than
``MAX_LINE_BYTES`` is cut there, its rest skipped unread into memory; a message keeps at most
``MAX_MESSAGE_LINES`` lines and ``MAX_MESSAGE_CHARS`` characters; at most ``MAX_ERRORS`` distinct
exceptions are kept, the rest counted). Lines are numbered as ``grep -n`` and editors number them:
by newline only (a ``\r`` progress bar or a form feed does not start a line).

What never ends is refused at once, in one line: a device (``/dev/zero``, ``/dev/urandom``), as
the file or as standard input, a named pipe that gives nothing within seconds (the file is opened
as every file a user names is, ``harness/core/user_files.py``), and a stream (a pipe) that gives
``MAX_NUL_BYTES`` of NUL bytes in a row (an endless source of them; a file, which ends, may hold a
hole of them where a crash left it).
"""

from __future__ import annotations

import os
import re
import stat
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import BinaryIO

from harness.analysis.explain.symptoms import Symptoms
from harness.core.errors import UserError
from harness.core.user_files import not_a_file, open_named

#: Terminal colour and cursor codes.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
#: A CI runner's timestamp (GitHub Actions: ``2026-11-23T18:44:22.1234567Z ``).
_TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z? ?")
#: torchrun's (and DeepSpeed's launcher's) per-rank prefixes.
_RANK_PREFIX = re.compile(r"^(?P<stream>\[(?:rank|default|r)\d+\]:) ?")
_TRACEBACK = "Traceback (most recent call last):"
#: Lines that end an exception's message: the next traceback, chained exceptions, a new log record.
_ENDS_MESSAGE = re.compile(
    r"^(?:Traceback \(most recent call last\):|During handling of the above exception|"
    r"The above exception was the direct cause|\[\d{4}-\d\d-\d\d[ T]|[WEIF]\d{4} \d\d:\d\d:\d\d|"
    r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)"
)
#: An exception line as a traceback ends with it: a dotted type name, then ``: message`` or nothing.
_EXCEPTION_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*)(?::(?: (?P<message>.*))?)?$")
#: Without a traceback header, only lines whose type looks like an exception's are taken.
_BARE_EXCEPTION_LINE = re.compile(
    r"^(?P<type>(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure|Warning)): (?P<message>.+)$"
)
#: The most lines one message may take.
MAX_MESSAGE_LINES = 200
#: The most characters one message keeps.
MAX_MESSAGE_CHARS = 16 * 1024
#: The most bytes of one line read; the rest of a longer line is skipped.
MAX_LINE_BYTES = 64 * 1024
#: The most distinct exceptions kept (the rest are counted).
MAX_ERRORS = 1000
#: The most streams (rank prefixes) told apart; lines of any further one are read as one more stream.
MAX_STREAMS = 256
#: NUL bytes in a row past which the input is no log (``/dev/zero`` through a pipe): refused.
MAX_NUL_BYTES = 64 * 2**20


class EndlessInput(Exception):
    """The input is no log and may never end (NUL bytes without end)."""


@dataclass(frozen=True)
class LoggedError:
    type: str
    message: str
    #: The exception line's number in the log (1-based, as ``grep -n`` numbers it).
    line: int
    #: How many streams (ranks) showed the same exception.
    streams: int = 1

    @property
    def first_line(self) -> str:
        return next((ln for ln in self.message.splitlines() if ln.strip()), "")


@dataclass(frozen=True)
class LogScan:
    """What a whole log showed."""

    #: Every exception, in the order of their first appearance.
    errors: list[LoggedError]
    #: How many lines were read.
    lines: int
    #: Distinct exceptions beyond ``MAX_ERRORS``, not kept.
    not_kept: int = 0


def _clean(line: str) -> tuple[str, str]:
    """(the line's stream, the line without its prefixes). Of a line a terminal rewrote with
    carriage returns (a progress bar), what it showed last."""
    line = line.rstrip("\r\n")
    if "\r" in line:
        line = line.rsplit("\r", 1)[-1]
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    line = _TIMESTAMP.sub("", line)
    match = _RANK_PREFIX.match(line)
    if match:
        return match["stream"], line[match.end() :]
    return "", line


@dataclass
class _Message:
    """An exception whose message is being read: the lines after its exception line."""

    type: str
    line: int
    parts: list[str]
    bare: bool
    chars: int = 0
    left: int = MAX_MESSAGE_LINES - 1

    def take(self, line: str) -> bool:
        """Add ``line`` to the message; False when the message ended before it."""
        if self.left <= 0 or _ENDS_MESSAGE.match(line):
            return False
        self.left -= 1
        if self.chars < MAX_MESSAGE_CHARS:
            self.parts.append(line[: MAX_MESSAGE_CHARS - self.chars])
            self.chars += len(self.parts[-1])
        return True

    def text(self) -> str:
        parts = list(self.parts)
        while parts and not parts[-1].strip():
            parts.pop()
        return "\n".join(parts)


@dataclass
class _Stream:
    in_traceback: bool = False
    saw_traceback: bool = False
    reading: list[_Message] = field(default_factory=list)
    #: Exceptions found without a traceback header: kept only if the stream never shows one.
    bare: list[tuple[str, str, int]] = field(default_factory=list)


class _Found:
    """Exceptions found so far, one per (type, message), bounded."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, str], list[int]] = {}
        self.not_kept = 0

    def add(self, etype: str, message: str, line: int) -> None:
        key = (etype, message)
        known = self.seen.get(key)
        if known is not None:
            known[0] = min(known[0], line)
            known[1] += 1
        elif len(self.seen) < MAX_ERRORS:
            self.seen[key] = [line, 1]
        else:
            self.not_kept += 1

    def errors(self) -> list[LoggedError]:
        found = [LoggedError(t, m, line, count) for (t, m), (line, count) in self.seen.items()]
        return sorted(found, key=lambda e: e.line)


class _Scanner:
    def __init__(self) -> None:
        self.streams: dict[str, _Stream] = {}
        self.found = _Found()
        #: What the log's metrics say where nothing was raised (``symptoms.py``).
        self.symptoms = Symptoms()

    def _stream(self, name: str) -> _Stream:
        stream = self.streams.get(name)
        if stream is None:
            if len(self.streams) >= MAX_STREAMS:
                name = "[more]"
            stream = self.streams.setdefault(name, _Stream())
        return stream

    def _ended(self, stream: _Stream, message: _Message) -> None:
        if message.bare:
            if len(stream.bare) < MAX_ERRORS:
                stream.bare.append((message.type, message.text(), message.line))
            else:
                self.found.not_kept += 1
        else:
            self.found.add(message.type, message.text(), message.line)

    def line(self, number: int, raw: str) -> None:
        name, line = _clean(raw)
        self.symptoms.line(number, line)
        stream = self._stream(name)
        if stream.reading:
            still = []
            for message in stream.reading:
                if message.take(line):
                    still.append(message)
                else:
                    self._ended(stream, message)
            stream.reading = still
        if line.startswith(_TRACEBACK):
            if not stream.saw_traceback:
                # A stream with a traceback is read by its tracebacks only.
                stream.bare.clear()
                stream.reading = [m for m in stream.reading if not m.bare]
            stream.in_traceback, stream.saw_traceback = True, True
            return
        if stream.in_traceback:
            if not line.strip() or line[0].isspace() or line.startswith("[Previous line repeated"):
                return  # a frame, its source line, a caret marker
            stream.in_traceback = False
            match = _EXCEPTION_LINE.match(line)
            if match:
                first = (match["message"] or "")[:MAX_MESSAGE_CHARS]
                stream.reading.append(_Message(match["type"], number, [first], bare=False, chars=len(first)))
        elif not stream.saw_traceback:
            bare = _BARE_EXCEPTION_LINE.match(line)
            if bare:
                first = bare["message"][:MAX_MESSAGE_CHARS]
                stream.reading.append(_Message(bare["type"], number, [first], bare=True, chars=len(first)))

    def end(self, lines: int) -> LogScan:
        for stream in self.streams.values():
            for message in stream.reading:
                self._ended(stream, message)
            stream.reading = []
            for etype, message_text, number in stream.bare:
                self.found.add(etype, message_text, number)
        for etype, message_text, number in self.symptoms.found():
            self.found.add(etype, message_text, number)
        return LogScan(self.found.errors(), lines, self.found.not_kept)


def scan_log(lines: Iterable[str]) -> LogScan:
    """Every exception in ``lines`` (a log's lines in order, the first numbered 1), read one at a time."""
    scanner = _Scanner()
    count = 0
    for count, raw in enumerate(lines, start=1):
        scanner.line(count, raw)
    return scanner.end(count)


def logged_errors(text: str) -> list[LoggedError]:
    """Every exception ``text`` shows, in the order of their first appearance."""
    return scan_log(text.split("\n")).errors


def log_lines(fh: BinaryIO, stream: bool = False) -> Iterator[str]:
    """``fh``'s lines, one at a time, split at newlines only; a line longer than ``MAX_LINE_BYTES``
    is cut there and its rest skipped (read in pieces, never held). Of a ``stream`` (no file that
    ends), ``EndlessInput`` after ``MAX_NUL_BYTES`` NUL bytes in a row."""
    nuls = 0

    def count_nuls(piece: bytes) -> None:
        nonlocal nuls
        if not stream:
            return
        body = piece.rstrip(b"\n")
        if body and not body.strip(b"\0"):
            nuls += len(body)
            if nuls > MAX_NUL_BYTES:
                raise EndlessInput(f"{nuls:,} NUL bytes in a row: binary data, not a log")
        elif body:
            nuls = len(body) - len(body.rstrip(b"\0"))

    while True:
        chunk = fh.readline(MAX_LINE_BYTES)
        if not chunk:
            return
        count_nuls(chunk)
        if len(chunk) == MAX_LINE_BYTES and not chunk.endswith(b"\n"):
            while True:
                rest = fh.readline(MAX_LINE_BYTES)
                if not rest:
                    break
                count_nuls(rest)
                if rest.endswith(b"\n"):
                    break
        yield chunk.decode("utf-8", errors="replace")


@contextmanager
def open_log(path: str) -> Iterator[Iterator[str]]:
    """The lines of the log at ``path`` (``-``: standard input), read as they are used."""
    if path == "-":
        given = os.fstat(sys.stdin.fileno()).st_mode
        problem = not_a_file(given) if not sys.stdin.isatty() else None
        if problem is not None:
            raise UserError("-", "LOG", f"standard input {problem}", "pipe or redirect a log file into it")
        try:
            yield log_lines(sys.stdin.buffer, stream=not stat.S_ISREG(given))
        except EndlessInput as exc:
            raise UserError("-", "LOG", str(exc), "pass a traceback or a CI log") from None
        return
    fix = "pass a traceback or CI log file, or - to read stdin"
    with open_named(path, "LOG", fix) as fh:
        regular = stat.S_ISREG(os.fstat(fh.fileno()).st_mode)
        try:
            yield log_lines(fh, stream=not regular)
        except EndlessInput as exc:
            raise UserError(path, "LOG", str(exc), "pass a traceback or a CI log") from None
        except OSError as exc:
            raise UserError(path, "LOG", f"cannot be read ({exc.strerror})", fix) from None
