"""The exceptions in a traceback or a CI log: their type, their whole message, and where they are.

A log interleaves streams: torchrun prefixes each rank's lines (``[rank0]: ``, ``[default1]:``),
CI runners prefix timestamps, terminals leave colour codes. Each line is stripped of those and
assigned to its stream, and each stream is read on its own: after ``Traceback (most recent call
last):`` come the indented frames, then the exception line ``module.Type: message``, whose message
runs on until the next traceback, a chained-exception line or a new log record. A stream with no
traceback header (a truncated log) is scanned for lines that look like an exception line. The
same exception raised by several ranks is reported once, with how many streams showed it.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

from harness.core.errors import UserError

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


@dataclass(frozen=True)
class LoggedError:
    type: str
    message: str
    #: The exception line's number in the log (1-based).
    line: int
    #: How many streams (ranks) showed the same exception.
    streams: int = 1

    @property
    def first_line(self) -> str:
        return next((ln for ln in self.message.splitlines() if ln.strip()), "")


def _clean(line: str) -> tuple[str, str]:
    """(the line's stream, the line without its prefixes)."""
    line = _ANSI.sub("", line).rstrip("\r\n")
    line = _TIMESTAMP.sub("", line)
    match = _RANK_PREFIX.match(line)
    if match:
        return match["stream"], line[match.end() :]
    return "", line


def _streams(text: str) -> dict[str, list[tuple[int, str]]]:
    streams: dict[str, list[tuple[int, str]]] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        stream, line = _clean(raw)
        streams.setdefault(stream, []).append((number, line))
    return streams


def _message(lines: list[tuple[int, str]], start: int, first: str) -> str:
    """The message beginning on the exception line ``start``: its text, then every following line
    up to the next traceback, chained exception or log record (trailing blank lines dropped)."""
    parts = [first]
    for _, line in lines[start + 1 : start + MAX_MESSAGE_LINES]:
        if _ENDS_MESSAGE.match(line):
            break
        parts.append(line)
    while parts and not parts[-1].strip():
        parts.pop()
    return "\n".join(parts)


def _in_stream(lines: list[tuple[int, str]]) -> list[LoggedError]:
    found: list[LoggedError] = []
    in_traceback = False
    saw_traceback = False
    for index, (number, line) in enumerate(lines):
        if line.startswith(_TRACEBACK):
            in_traceback, saw_traceback = True, True
            continue
        if not in_traceback:
            continue
        if not line.strip() or line[0].isspace() or line.startswith("[Previous line repeated"):
            continue  # a frame, its source line, a caret marker
        in_traceback = False
        match = _EXCEPTION_LINE.match(line)
        if match:
            found.append(LoggedError(match["type"], _message(lines, index, match["message"] or ""), number))
    if not saw_traceback:
        for index, (number, line) in enumerate(lines):
            bare = _BARE_EXCEPTION_LINE.match(line)
            if bare:
                found.append(LoggedError(bare["type"], _message(lines, index, bare["message"]), number))
    return found


def logged_errors(text: str) -> list[LoggedError]:
    """Every exception the log shows, in the order of their first appearance."""
    seen: dict[tuple[str, str], LoggedError] = {}
    for lines in _streams(text).values():
        for error in _in_stream(lines):
            key = (error.type, error.message)
            if key in seen:
                earlier = seen[key]
                first = min(earlier.line, error.line)
                seen[key] = LoggedError(earlier.type, earlier.message, first, earlier.streams + 1)
            else:
                seen[key] = error
    return sorted(seen.values(), key=lambda e: e.line)


#: The most of a log read: its end, where the failure usually is.
MAX_LOG_BYTES = 64 << 20


def read_log(path: str) -> tuple[str, bool]:
    """The log's text (its last ``MAX_LOG_BYTES``) and whether it was cut."""
    if path == "-":
        data = sys.stdin.buffer.read()
    else:
        try:
            with open(path, "rb") as fh:
                fh.seek(0, 2)
                size = fh.tell()
                fh.seek(max(0, size - MAX_LOG_BYTES))
                data = fh.read()
        except FileNotFoundError:
            raise UserError(
                path, "LOG", "no such file", "pass a traceback or CI log file, or - to read stdin"
            ) from None
        except IsADirectoryError:
            raise UserError(path, "LOG", "is a directory", "pass a log file, e.g. a rank's rank0.log") from None
        except OSError as exc:
            raise UserError(
                path, "LOG", f"cannot be read ({exc.strerror})", "check the path and its permissions"
            ) from None
    cut = len(data) > MAX_LOG_BYTES
    return data[-MAX_LOG_BYTES:].decode("utf-8", errors="replace"), cut
