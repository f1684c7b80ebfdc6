"""An item's logs, copied by the orchestrator and capped: each keeps its head and its tail.

A rank that prints without end (a warning in a loop, a flood of NCCL debug lines) would keep
hundreds of megabytes a rank on disk, and fill it. So no process of an item writes its log
itself: for each log (``launcher.log``, ``rank<R>.log``) the orchestrator makes a named pipe
beside it (``repros/runtime/record.py``: ``log_pipe_path``), each rank writes through it
(``open_log``), and one thread per item copies every pipe into its log: the first
``head_bytes`` straight into the file, then the rest into a ring of ``tail_bytes`` on disk
beside it. When the item is over the ring's last bytes are appended after a marked cut
(``... N bytes cut ...``). Memory stays one read buffer, however much is written; the disk
holds at most head plus tail (plus the ring while the item runs).

A write the disk refuses (ENOSPC, EDQUOT) is remembered, not raised: the copier keeps reading
(a rank blocked on a full pipe would look like a hang) and drops what it cannot keep, and the
launcher reports the disk, not the item (``diagnose.py``).
"""

from __future__ import annotations

import errno
import os
import selectors
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from repros.runtime.record import log_pipe_path

#: What each log keeps of its beginning and of its end (the rest is cut, and says so).
HEAD_BYTES = 2 * 2**20
TAIL_BYTES = 6 * 2**20
#: What the copier reads and writes at a time: all the memory a log takes.
CHUNK_BYTES = 64 * 2**10
#: Writes the disk refused: it is full (or the user's quota is).
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
#: How long the copier waits, after the item's processes are gone, for the last bytes of its pipes.
DRAIN_S = 5.0


def cut_marker(cut: int) -> bytes:
    return f"\n... {cut} bytes cut ...\n".encode()


@dataclass
class CappedLog:
    """One log: its head in ``path``, its tail in a ring beside it until ``close``."""

    path: Path
    head_bytes: int = HEAD_BYTES
    tail_bytes: int = TAIL_BYTES
    #: Bytes written to the log, kept or not.
    received: int = 0
    #: Bytes dropped because the disk refused them.
    lost: int = 0
    #: The first write the disk refused, if any.
    error: OSError | None = None
    _fd: int | None = field(default=None, repr=False)
    _ring_fd: int | None = field(default=None, repr=False)
    _head_left: int = 0
    _ring_written: int = 0

    def __post_init__(self) -> None:
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            # A log appended to (a rerun in the same directory) counts what it already holds as head.
            self._head_left = max(0, self.head_bytes - os.fstat(self._fd).st_size)
        except OSError as exc:
            self.error = exc  # what comes is counted as lost

    @property
    def ring_path(self) -> Path:
        return self.path.with_name(f".{self.path.name}.tail")

    def write(self, data: bytes) -> None:
        self.received += len(data)
        if self.error is not None:
            self.lost += len(data)
            return
        pending = len(data)
        try:
            if self._head_left:
                head, data = data[: self._head_left], data[self._head_left :]
                self._write_all(self._fd, head)
                self._head_left -= len(head)
                pending -= len(head)
            if data:
                self._to_ring(data)
        except OSError as exc:
            self.error = exc
            self.lost += pending

    def _to_ring(self, data: bytes) -> None:
        if self.tail_bytes <= 0:
            self._ring_written += len(data)
            return
        if self._ring_fd is None:
            self._ring_fd = os.open(self.ring_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        if len(data) > self.tail_bytes:  # only its end can survive
            self._ring_written += len(data) - self.tail_bytes
            data = data[-self.tail_bytes :]
        while data:
            at = self._ring_written % self.tail_bytes
            piece = data[: self.tail_bytes - at]
            written = os.pwrite(self._ring_fd, piece, at)
            self._ring_written += written
            data = data[written:]

    @staticmethod
    def _write_all(fd: int | None, data: bytes) -> None:
        assert fd is not None
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]

    def _ring_in_order(self) -> Iterator[bytes]:
        """The ring's bytes, oldest first, a chunk at a time."""
        assert self._ring_fd is not None
        kept = min(self._ring_written, self.tail_bytes)
        start = self._ring_written % self.tail_bytes if self._ring_written > self.tail_bytes else 0
        done = 0
        while done < kept:
            at = (start + done) % self.tail_bytes
            size = min(CHUNK_BYTES, kept - done, self.tail_bytes - at)
            data = os.pread(self._ring_fd, size, at)
            if not data:
                return
            done += len(data)
            yield data

    @property
    def cut(self) -> int:
        """Bytes between the head and the tail that the log does not keep."""
        return max(0, self._ring_written - self.tail_bytes)

    def close(self) -> None:
        """Append the tail (after the cut's marker, if anything was cut) and close the log."""
        try:
            if self._ring_fd is not None and self.error is None:
                chunks = self._ring_in_order()
                if self.cut:
                    # Cut at a line's end where one is near: the tail starts with a whole line.
                    # The ring may wrap inside the first 4 KiB: look across its chunks.
                    first = b""
                    for chunk in chunks:
                        first += chunk
                        if len(first) >= 4096:
                            break
                    newline = first.find(b"\n", 0, 4096)
                    skipped = newline + 1 if newline >= 0 else 0
                    self._write_all(self._fd, cut_marker(self.cut + skipped) + first[skipped:])
                for chunk in chunks:
                    self._write_all(self._fd, chunk)
            if self.error is not None and self.lost:
                try:
                    self._write_all(self._fd, f"\n... {self.lost} bytes lost: {self.error.strerror} ...\n".encode())
                except OSError:
                    pass
        except OSError as exc:
            self.error = self.error or exc
        finally:
            for fd in (self._ring_fd, self._fd):
                if fd is not None:
                    os.close(fd)
            self._ring_fd = self._fd = None
            self.ring_path.unlink(missing_ok=True)

    @property
    def disk_full(self) -> bool:
        return self.error is not None and self.error.errno in DISK_FULL_ERRNOS


@dataclass
class _Stream:
    log: CappedLog
    read_fd: int
    keep_open_fd: int | None
    pipe: Path | None


class LogPump:
    """Copies an item's pipes into their capped logs, on a thread of its own, until ``finish``.

    ``listen(path)`` makes the named pipe for ``path`` (where the item's processes find it);
    ``attach(path)`` returns the write end of an anonymous pipe for a process the orchestrator
    starts itself (torchrun's own output). Where a named pipe cannot be made (a filesystem
    without them), the log is written directly by its process, uncapped.
    """

    def __init__(self, head_bytes: int | None = None, tail_bytes: int | None = None) -> None:
        self.head_bytes = HEAD_BYTES if head_bytes is None else head_bytes
        self.tail_bytes = TAIL_BYTES if tail_bytes is None else tail_bytes
        self.logs: dict[Path, CappedLog] = {}
        self._streams: dict[int, _Stream] = {}
        self._selector = selectors.DefaultSelector()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _add(self, path: Path, read_fd: int, keep_open_fd: int | None, pipe: Path | None) -> None:
        log = CappedLog(path, self.head_bytes, self.tail_bytes)
        os.set_blocking(read_fd, False)
        with self._lock:
            self.logs[path] = log
            self._streams[read_fd] = _Stream(log, read_fd, keep_open_fd, pipe)
            self._selector.register(read_fd, selectors.EVENT_READ)

    def listen(self, path: Path) -> bool:
        """A named pipe for ``path``, read from now on; False where none could be made."""
        pipe = log_pipe_path(path)
        try:
            pipe.unlink(missing_ok=True)
            os.mkfifo(pipe, 0o600)
            read_fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
            # Held until ``finish``: the pipe reaches its end when the item's last writer is gone,
            # not when a rank that has not opened it yet has no writer.
            keep_open_fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            pipe.unlink(missing_ok=True)
            return False
        self._add(path, read_fd, keep_open_fd, pipe)
        return True

    def attach(self, path: Path) -> int:
        """The write end of a pipe copied into ``path`` (the caller passes it on, then closes it)."""
        read_fd, write_fd = os.pipe()
        self._add(path, read_fd, None, None)
        return write_fd

    def start(self) -> LogPump:
        self._thread = threading.Thread(target=self._run, name="item-logs", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                if not self._streams:
                    return
            for key, _ in self._selector.select(timeout=0.2):
                self._pump(int(key.fd))

    def _pump(self, fd: int) -> None:
        stream = self._streams.get(fd)
        if stream is None:
            return
        while True:
            try:
                data = os.read(fd, CHUNK_BYTES)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._end(stream)
                return
            stream.log.write(data)

    def _end(self, stream: _Stream) -> None:
        with self._lock:
            self._streams.pop(stream.read_fd, None)
            self._selector.unregister(stream.read_fd)
        os.close(stream.read_fd)
        stream.log.close()
        if stream.pipe is not None:
            stream.pipe.unlink(missing_ok=True)

    def finish(self, drain_s: float = DRAIN_S) -> None:
        """The item's processes are gone: copy what is left in the pipes and close every log."""
        with self._lock:
            streams = list(self._streams.values())
        for stream in streams:
            if stream.keep_open_fd is not None:
                os.close(stream.keep_open_fd)
                stream.keep_open_fd = None
        deadline = time.monotonic() + drain_s
        while self._thread is not None and self._thread.is_alive() and time.monotonic() < deadline:
            self._thread.join(timeout=0.05)
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        # A pipe still open past the drain (a writer that escaped every sweep): keep what came.
        with self._lock:
            left = list(self._streams.values())
        for stream in left:
            self._pump(stream.read_fd)
            if stream.read_fd in self._streams:
                self._end(stream)
        self._selector.close()

    def disk_full(self) -> list[CappedLog]:
        """The logs whose writes the disk refused."""
        return [log for log in self.logs.values() if log.disk_full]
