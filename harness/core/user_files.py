"""Every file a user names, read one way: what never ends is refused, in one line naming the file, within seconds.

A user names files (``--requirements``, ``--matrix``, ``--freeze``, ``--costs``, a log for ``explain``, what
``--from`` directories hold) and may name one that is no file at all: a device (``/dev/zero``, ``/dev/urandom``:
endless), a socket, a directory, or a named pipe (a FIFO, or ``<(command)``), which may have no writer yet, or
never end. Here:

- a device, a socket or a directory is refused before anything is read from it;
- a named pipe is opened without waiting for a writer; its first bytes must come within ``MAX_WAIT_S``, and a
  file read whole (``read_named``) must end within that time too (a pipe's writer that never finishes is named);
- a file read whole is read up to its limit plus one byte and refused past it (its ``st_size`` is never trusted:
  a device and a pipe both say 0).

``open_named`` is the opener every reader of a user's file goes through (``explain`` streams a log through it);
``read_named`` reads one whole within a limit.
"""

from __future__ import annotations

import errno
import os
import select
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from harness.core.errors import UserError

#: How long a named pipe may take to give its first bytes (and, read whole, all of them).
MAX_WAIT_S = 10.0
#: How much is read at a time from a pipe.
_CHUNK = 1 << 16


def not_a_file(mode: int) -> str | None:
    """What a path of this mode is, where it is no file to read (a device, a socket, a directory)."""
    if stat.S_ISDIR(mode):
        return "is a directory"
    if stat.S_ISCHR(mode):
        return "is a character device, not a file (it may never end)"
    if stat.S_ISBLK(mode):
        return "is a block device, not a file"
    if stat.S_ISSOCK(mode):
        return "is a socket, not a file"
    return None


def _open_fd(path: str | Path, option: str, fix: str) -> tuple[int, int]:
    """The file opened for reading without waiting (a pipe with no writer yet does not block), and its mode."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise UserError(path, option, "no such file", fix) from None
    except OSError as exc:
        raise UserError(path, option, f"cannot be read ({exc.strerror})", fix) from None
    problem = not_a_file(mode)
    if problem is not None:
        raise UserError(path, option, problem, fix)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise UserError(path, option, f"cannot be read ({exc.strerror})", fix) from None
    mode = os.fstat(fd).st_mode  # what was opened, whatever the path names now
    problem = not_a_file(mode)
    if problem is not None:
        os.close(fd)
        raise UserError(path, option, problem, fix)
    return fd, mode


def _wait_readable(fd: int, deadline: float) -> bool:
    """Whether the pipe has bytes (or its writer closed it) before ``deadline``."""
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        try:
            if poller.poll(max(1, int(left * 1000))):
                return True
        except InterruptedError:
            continue


def _pipe_waited_out(path: str | Path, option: str, fix: str, wait_s: float, got: int) -> UserError:
    what = "gave nothing" if got == 0 else f"did not end ({got} bytes)"
    return UserError(path, option, f"is a named pipe that {what} within {wait_s:g} s", fix)


@contextmanager
def open_named(path: str | Path, option: str, fix: str, *, wait_s: float = MAX_WAIT_S) -> Iterator[BinaryIO]:
    """``path`` opened for reading (binary, blocking reads): a device, a socket or a directory refused; a named
    pipe's first bytes waited for at most ``wait_s`` (none: refused, naming the file)."""
    fd, mode = _open_fd(path, option, fix)
    try:
        if stat.S_ISFIFO(mode) and not _wait_readable(fd, time.monotonic() + wait_s):
            raise _pipe_waited_out(path, option, fix, wait_s, 0)
        os.set_blocking(fd, True)
        handle = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with handle:
        yield handle


def _read_pipe(fd: int, path: str | Path, option: str, fix: str, limit: int, wait_s: float) -> bytes:
    deadline = time.monotonic() + wait_s
    parts: list[bytes] = []
    got = 0
    while got <= limit:
        if not _wait_readable(fd, deadline):
            raise _pipe_waited_out(path, option, fix, wait_s, got)
        try:
            piece = os.read(fd, min(_CHUNK, limit + 1 - got))
        except BlockingIOError:
            continue
        if not piece:
            break
        parts.append(piece)
        got += len(piece)
    return b"".join(parts)


def read_named(
    path: str | Path, option: str, fix: str, *, limit: int, what: str = "such a file", wait_s: float = MAX_WAIT_S
) -> bytes:
    """The whole of ``path``, at most ``limit`` bytes (more: refused, naming the file, the limit and ``what`` it
    should be), a named pipe within ``wait_s``."""
    fd, mode = _open_fd(path, option, fix)
    try:
        if stat.S_ISFIFO(mode):
            data = _read_pipe(fd, path, option, fix, limit, wait_s)
        else:
            os.set_blocking(fd, True)
            with os.fdopen(os.dup(fd), "rb") as handle:
                data = handle.read(limit + 1)
    except OSError as exc:
        if exc.errno == errno.EISDIR:
            raise UserError(path, option, "is a directory", fix) from None
        raise UserError(path, option, f"cannot be read ({exc.strerror})", fix) from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise UserError(path, option, f"is more than {limit} bytes, more than {what} needs", fix)
    return data


def read_named_text(
    path: str | Path, option: str, fix: str, *, limit: int, what: str = "such a file", wait_s: float = MAX_WAIT_S
) -> str:
    """``read_named`` as UTF-8 text (anything else: refused, naming the file)."""
    data = read_named(path, option, fix, limit=limit, what=what, wait_s=wait_s)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(path, option, "is not UTF-8 text", fix) from None
