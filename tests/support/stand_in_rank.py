"""A stand-in for ``rank_main.main`` that the cell server's forked ranks can run without torch.

``--module`` names a behaviour instead of a repro: ``ok`` (records and exits 0), ``raise``
(rank 0 records an error and exits 1 while rank 1 waits to be stopped), ``kill1`` (rank 1
SIGKILLs itself, rank 0 waits), ``hang`` (every rank starts a child and both sleep
forever), ``daemon`` (every rank leaves a daemon behind: new session, empty environment),
``env`` (records the variables a rank was given), ``cuda`` (with ``tests/support/fake_cuda`` on the
path: records whether the stand-in CUDA was initialised and which modules were already imported
when the rank started, then initialises CUDA itself). Records are written the way
rank_main writes them, so the orchestrator's classification reads them as usual: what the
stand-in observed (its environment, parent, session, the child or daemon it started) is
recorded under ``facts``, as a repro's facts are.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from repros.runtime.record import write_rank_record

_SEEN = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "LOCAL_SIZE",
    "FT_REGRESS_ITEM_TOKEN",
    "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--module")
    parser.add_argument("--mode")
    parser.add_argument("--item-dir", type=Path)
    parser.add_argument("--params", default="{}")
    args = parser.parse_args(argv)
    rank = int(os.environ["RANK"])
    log = open(args.item_dir / f"rank{rank}.log", "a", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    facts = {"env": {k: os.environ.get(k) for k in _SEEN}, "parent": os.getppid(), "session": os.getsid(0)}
    record = {
        "rank": rank,
        "world_size": int(os.environ["WORLD_SIZE"]),
        "pid": os.getpid(),
        "mode": args.mode,
        "status": "running",
        "phase": "run",
        "device": "cpu",
        "backend": "stand-in",
        "facts": facts,
    }
    write_rank_record(args.item_dir, rank, record)
    behaviour = args.module
    if behaviour == "raise" and rank == 0:
        record.update(status="error", error={"type": "ValueError", "message": "stand-in failure", "traceback": ""})
        write_rank_record(args.item_dir, rank, record)
        print("rank 0 raises", flush=True)
        return 1
    if behaviour == "kill1" and rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    if behaviour in ("raise", "kill1"):
        time.sleep(60)  # the leader stops this rank once its peer has failed
    if behaviour == "daemon":
        # Escape every sweep but a cgroup: a double fork into a new session with an empty environment.
        read, write = os.pipe()
        if os.fork() == 0:
            os.setsid()
            grandchild = os.fork()
            if grandchild:
                os.write(write, str(grandchild).encode())
                os._exit(0)
            os.execve("/bin/sleep", ["sleep", "600"], {})
        facts["daemon"] = int(os.read(read, 32))
        os.wait()  # the intermediate child
        write_rank_record(args.item_dir, rank, record)
    if behaviour == "cuda":
        import torch

        facts["cuda_initialized_at_start"] = torch.cuda.is_initialized()
        facts["preimported"] = sorted(
            m for m in ("harmless", "cuda_at_import", "uses_cuda_at_import") if m in sys.modules
        )
        import uses_cuda_at_import  # noqa: F401 - what the worker left to the rank

        facts["cuda_usable"] = torch.cuda.is_initialized()
        write_rank_record(args.item_dir, rank, record)
    if behaviour == "hang":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        facts["child"] = child.pid
        write_rank_record(args.item_dir, rank, record)
        time.sleep(600)
    record["status"] = "ok"
    write_rank_record(args.item_dir, rank, record)
    return 0
