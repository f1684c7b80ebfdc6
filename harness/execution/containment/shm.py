"""Remove the shared-memory segments an item's ranks left behind in ``/dev/shm``.

DeepSpeed's CPU accelerator keeps its all-reduce workspace in POSIX shared memory named
``deepspeed_allreduce_buffer_<n>_<MASTER_ADDR>_<MASTER_PORT>_<rank>`` (about 65 MiB each)
and never unlinks it. ``/dev/shm`` is memory: measured here, a day of runs left 306
segments holding 20 GiB, and items began to hang and fail as the machine ran out. The
rendezvous port is unique to a launch while it runs, so the segments that name an item's
address and port are that item's alone, and are removed once its processes are gone.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from harness.records.rank import RankRecord

SHM_DIR = Path("/dev/shm")
#: What DeepSpeed's shared-memory segments are called (deepspeed/ops/csrc/cpu/comm/shm.cpp).
DEEPSPEED_PREFIX = "deepspeed_"


def rendezvous_points(records: Iterable[RankRecord | None]) -> set[tuple[str, str]]:
    """The (MASTER_ADDR, MASTER_PORT) pairs the item's ranks recorded."""
    return {
        (rec.master_addr, rec.master_port) for rec in records if rec and rec.master_addr is not None and rec.master_port
    }


def item_segments(addr: str, port: str, shm_dir: Path = SHM_DIR) -> list[Path]:
    infix = f"_{addr}_{port}_"
    try:
        return sorted(p for p in shm_dir.iterdir() if p.name.startswith(DEEPSPEED_PREFIX) and infix in p.name)
    except OSError:
        return []


def remove_item_segments(records: Iterable[RankRecord | None], shm_dir: Path = SHM_DIR) -> list[str]:
    """Unlink the DeepSpeed segments named after the item's rendezvous; their names."""
    removed = []
    for addr, port in sorted(rendezvous_points(records)):
        for path in item_segments(addr, port, shm_dir):
            try:
                path.unlink()
                removed.append(path.name)
            except FileNotFoundError:
                pass
    return removed
