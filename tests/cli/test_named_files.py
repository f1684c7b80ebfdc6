"""Every file a user names is read one way (issue 50, class 4): a device (``/dev/zero``) and a named pipe nobody
writes to end with exit 2 within seconds, in one line naming the file, whichever option named it; a named pipe
that does give a file (``<(command)``) is read like the file."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.cli.test_bad_options import cli, refused
from tests.support.paths import REPO_ROOT

#: The issue's bar: exit 2 within a minute (the reader gives a pipe ten seconds).
WITHIN_S = 60


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "named.pipe"
    os.mkfifo(path)
    return path


def _timed(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = cli(tmp_path, *args)
    return done, time.monotonic() - started


#: Every command that reads a file a user names, and the option it names it by.
READERS = {
    "requirements": ("atlas", "check", "--requirements", "{file}"),
    "explain-log": ("explain", "{file}"),
    "freeze": ("explain", "--freeze", "{file}", "{log}"),
    "matrix": ("run", "--matrix", "{file}"),
    "costs": ("explain", "--costs", "{file}", "{log}"),
}


@pytest.fixture
def ci_log(tmp_path: Path) -> Path:
    """The log the readers that also take one are given (written once: the pipe readers run side by side)."""
    log = tmp_path / "ci.log"
    log.write_text("RuntimeError: boom\n")
    return log


def _command(reader: str, file: str, log: Path) -> list[str]:
    return [a.format(file=file, log=log) for a in READERS[reader]]


@pytest.mark.parametrize("reader", READERS)
def test_an_endless_device_is_refused_naming_it_at_once(tmp_path: Path, ci_log: Path, reader: str) -> None:
    done, took = _timed(tmp_path, *_command(reader, "/dev/zero", ci_log))
    refused(done, "/dev/zero", "is a character device")
    assert took < WITHIN_S


def test_a_named_pipe_nobody_writes_is_refused_by_every_reader_within_seconds(tmp_path: Path, ci_log: Path) -> None:
    # Each reader waits its 10 s for a writer: the five wait side by side, each on a pipe of its own.
    pipes = {reader: tmp_path / f"{reader}.pipe" for reader in READERS}
    for pipe in pipes.values():
        os.mkfifo(pipe)
    results: dict[str, tuple[subprocess.CompletedProcess[str], float]] = {}

    def read_with(reader: str) -> None:
        results[reader] = _timed(tmp_path, *_command(reader, str(pipes[reader]), ci_log))

    waiting = [threading.Thread(target=read_with, args=(reader,)) for reader in READERS]
    for thread in waiting:
        thread.start()
    for thread in waiting:
        thread.join(timeout=WITHIN_S * 2)
    assert sorted(results) == sorted(READERS), "every reader ended"
    for reader, (done, took) in results.items():
        refused(done, str(pipes[reader]), "is a named pipe that gave nothing within 10 s")
        assert took < WITHIN_S, reader


def test_a_matrix_given_through_a_pipe_is_read_once(fifo: Path) -> None:
    # `--matrix <(command)`: a pipe gives its bytes once; a second read found nothing ("is not a mapping").
    with pipe_giving(fifo, (REPO_ROOT / "matrix.yaml").read_text()):
        done = subprocess.run(
            [sys.executable, "-m", "harness", "crosscheck", "--list", "--lane", "ci", "--matrix", str(fifo)],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=WITHIN_S,
            check=False,
        )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "zero3-fp32-ckpt-nr" in done.stdout.split()


def test_the_bar_atlas_check_of_dev_zero_exits_2_within_a_minute(tmp_path: Path) -> None:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "harness", "atlas", "check", "--requirements", "/dev/zero"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=WITHIN_S * 2,
        check=False,
    )
    refused(done, "/dev/zero: --requirements: is a character device")
    assert time.monotonic() - started < WITHIN_S


@contextmanager
def pipe_giving(fifo: Path, text: str) -> Iterator[None]:
    """A writer fills the named pipe with ``text`` once a reader opens it, as ``<(command)`` does."""

    def write() -> None:
        with open(fifo, "w") as out:  # blocks until the reader opens it
            out.write(text)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    yield
    if writer.is_alive():  # the reader never opened it: let the writer go
        with open(fifo, "rb"):
            pass
    writer.join(timeout=10)


@pytest.fixture
def written_pipe(fifo: Path) -> Iterator[Path]:
    """A named pipe a writer fills with a pinned stack, as ``<(pip freeze)`` gives one."""
    with pipe_giving(fifo, "torch==2.13.0\ndeepspeed==0.19.8\npeft==0.21.2\ntransformers==5.23.0\n"):
        yield fifo


def test_a_named_pipe_that_gives_a_file_is_read_as_the_file(written_pipe: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "harness", "atlas", "check", "--requirements", str(written_pipe), "--repros", "F1"]
        + ["--device", "cpu"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=WITHIN_S,
        check=False,
    )
    assert done.returncode in (0, 1) and done.stdout.startswith("F1 "), done.stdout + done.stderr


def test_a_named_pipe_whose_writer_never_ends_is_refused(tmp_path: Path, fifo: Path) -> None:
    writer = subprocess.Popen(["sh", "-c", f"yes torch==2.13.0 > {fifo}"])
    try:
        done, took = _timed(tmp_path, "atlas", "check", "--requirements", str(fifo))
    finally:
        writer.kill()
        writer.wait()
    refused(done, str(fifo), "more than a lock needs")
    assert took < WITHIN_S
