"""Stand-in ranks (no torch) for the containment, log and machine-reason tests, run by a cell's
worker (``--rank-entry tests.execution.contained_ranks:main``) or by ``FAKE_TORCHRUN`` below.

``--module`` names a behaviour: ``ok``; ``flood:N`` (N bytes on stdout, numbered lines, then a
last line); ``rmdir`` (rank 0 removes the item's directory, then both ranks go on to the end);
``daemon`` / ``daemon-hang`` (a double fork, ``setsid`` and an empty environment: a daemon no
session, token or marker finds; then end, or hang); ``shm-hang`` (a DeepSpeed-named segment in
``$FAKE_SHM_DIR`` after the rendezvous, then hang). The rank writes its log through
``open_log`` and its record as ``rank_main`` does.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

from repros.runtime.record import open_log, rank_log_path, write_rank_record

FAKE_TORCHRUN = """
import argparse, os, socket, subprocess, sys
parser = argparse.ArgumentParser()
parser.add_argument("--standalone", action="store_true")
parser.add_argument("--nnodes")
parser.add_argument("--nproc_per_node", type=int)
parser.add_argument("--max_restarts")
parser.add_argument("-m", dest="module")
args, rest = parser.parse_known_args()
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
entry = "from tests.execution.contained_ranks import main; import sys; sys.exit(main(sys.argv[1:]))"
ranks = [
    # Like torchrun: each rank in a session of its own.
    subprocess.Popen([sys.executable, "-c", entry, *rest], start_new_session=True,
                     env=dict(os.environ, RANK=str(r), WORLD_SIZE=str(args.nproc_per_node),
                              MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
    for r in range(args.nproc_per_node)
]
sys.exit(max(abs(p.wait()) for p in ranks))
"""


def _daemon() -> int:
    """A grandchild in a session of its own with an empty environment; its pid."""
    read, write = os.pipe()
    if os.fork() == 0:
        os.setsid()
        grandchild = os.fork()
        if grandchild:
            os.write(write, str(grandchild).encode())
            os._exit(0)
        os.execve("/bin/sleep", ["sleep", "600"], {})
    pid = int(os.read(read, 32))
    os.wait()
    return pid


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--module")
    parser.add_argument("--mode")
    parser.add_argument("--item-dir", type=Path)
    parser.add_argument("--params", default="{}")
    args = parser.parse_args(argv)
    rank = int(os.environ["RANK"])
    item_dir: Path = args.item_dir
    log = open_log(rank_log_path(item_dir, rank))
    os.dup2(log, 1)
    os.dup2(log, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    facts: dict[str, object] = {}
    record: dict[str, object] = {
        "rank": rank,
        "world_size": int(os.environ["WORLD_SIZE"]),
        "pid": os.getpid(),
        "status": "running",
        "phase": "run",
        "master_addr": os.environ.get("MASTER_ADDR"),
        "master_port": os.environ.get("MASTER_PORT"),
        "facts": facts,
    }
    write_rank_record(item_dir, rank, record)
    behaviour, _, argument = str(args.module).partition(":")
    if behaviour == "flood":
        size = int(argument)
        written = 0
        line = 0
        while written < size:
            text = f"line {line:09d} " + "x" * 50 + "\n"
            sys.stdout.write(text)
            written += len(text)
            line += 1
        sys.stdout.write("the last line of the flood\n")
        sys.stdout.flush()
    if behaviour == "rmdir":
        if rank == 0:
            deadline = time.monotonic() + 10
            while item_dir.exists() and time.monotonic() < deadline:  # its peer may be writing into it
                shutil.rmtree(item_dir, ignore_errors=True)
        time.sleep(0.5)
        try:
            write_rank_record(item_dir, rank, {**record, "status": "ok"})
        except OSError:
            return 1
        return 0
    if behaviour.startswith("daemon"):
        facts["daemon"] = _daemon()
        write_rank_record(item_dir, rank, record)
    if behaviour == "shm-hang":
        shm = Path(os.environ["FAKE_SHM_DIR"])
        name = f"deepspeed_allreduce_buffer_0_{os.environ['MASTER_ADDR']}_{os.environ['MASTER_PORT']}_{rank}"
        (shm / name).write_bytes(b"\0" * 64)
        facts["segment"] = name
        write_rank_record(item_dir, rank, record)
    if behaviour.endswith("hang"):
        time.sleep(600)
    record["status"] = "ok"
    write_rank_record(item_dir, rank, record)
    return 0
