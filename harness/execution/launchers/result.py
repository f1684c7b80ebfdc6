"""What a launch returns, and how a finished launch is read back from its item directory."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness.execution.containment.shm import remove_item_segments
from harness.execution.launchers.diagnose import DirIdentity, machine_reason
from harness.execution.launchers.logs import CappedLog
from harness.records.rank import RankRecord, read_rank_record
from repros.runtime.record import rank_log_path, rank_record_path

TAIL_BYTES = 4000


@dataclass
class LaunchResult:
    command: list[str]
    returncode: int | None
    timed_out: bool
    wall_s: float
    world_size: int
    #: Each rank's record, or None where the rank never wrote one.
    records: dict[int, RankRecord | None]
    #: Exit codes of the ranks that failed on their own (negative: killed by that signal).
    rank_exitcodes: dict[int, int] = field(default_factory=dict)
    rank_tails: dict[int, str] = field(default_factory=dict)
    launcher_tail: str = ""
    #: Processes of the item still alive after it ended, killed by the sweeps.
    leftovers_killed: list[int] = field(default_factory=list)
    #: Build locks a killed JIT build had left in the environment's extensions dir.
    stale_build_locks_removed: list[str] = field(default_factory=list)
    #: DeepSpeed's shared-memory segments the item left in /dev/shm, removed after it.
    shm_segments_removed: list[str] = field(default_factory=list)
    #: The launcher that started the ranks (its registered name).
    launcher: str = "torchrun"
    #: Why the launcher asked for could not start them (another one did), if so.
    fallback_reason: str = ""
    #: What the machine did to the item, if anything (a full disk, its directory removed): it, not
    #: the item, decides the outcome (INFRA, with this reason).
    machine_reason: str = ""
    #: On a timeout, what each rank that had not ended was doing (its phase), by rank.
    hung: dict[int, str] = field(default_factory=dict)
    #: Bytes cut from the middle of each log that overflowed its cap, by log name.
    logs_cut: dict[str, int] = field(default_factory=dict)
    #: When the launcher started the item (``time.time()``): with the ranks' ``training_began_at``,
    #: how long the item took to start training.
    launched_at: float | None = None

    @property
    def to_training_s(self) -> float | None:
        """Seconds from the launch to the first training step of the slowest rank, where every rank trained."""
        began = [rec.training_began_at for rec in self.records.values() if rec is not None]
        if self.launched_at is None or not began or any(b is None for b in began) or len(began) != self.world_size:
            return None
        return max(0.0, max(b for b in began if b is not None) - self.launched_at)

    @property
    def training_s(self) -> float | None:
        """Seconds from the first rank's first step to the last rank's last step, where every rank trained."""
        spans = [(r.training_began_at, r.training_ended_at) for r in self.records.values() if r is not None]
        if not spans or len(spans) != self.world_size or any(a is None or b is None for a, b in spans):
            return None
        return max(0.0, max(b for _, b in spans if b is not None) - min(a for a, _ in spans if a is not None))


def tail(path: Path, limit: int = TAIL_BYTES) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - limit))
            data = fh.read()
    except (FileNotFoundError, IsADirectoryError):
        return ""
    text = data.decode("utf-8", errors="replace")
    return text if size <= limit else "…" + text


def collect_item(
    command: list[str],
    item_dir: Path,
    world_size: int,
    returncode: int | None,
    timed_out: bool,
    wall_s: float,
    leftovers: list[int],
    *,
    rank_exitcodes: dict[int, int],
    stale_locks: Sequence[str] = (),
    launcher: str = "torchrun",
    logs: Sequence[CappedLog] = (),
    dir_before: DirIdentity | None = None,
    scan_root: Path | None = None,
    hung: dict[int, str] | None = None,
    launched_at: float | None = None,
) -> LaunchResult:
    """Read back what a finished launch left in ``item_dir``, once every process of it is
    gone (and its ``logs`` closed), remove what DeepSpeed left of it in /dev/shm (memory), and
    say what the machine did to it, if anything (``diagnose.py``)."""
    records = {r: read_rank_record(rank_record_path(item_dir, r)) for r in range(world_size)}
    shm_removed = remove_item_segments(records.values())
    machine = machine_reason(item_dir, dir_before, logs, records, scan_root)
    return LaunchResult(
        command=command,
        returncode=None if timed_out else returncode,
        timed_out=timed_out,
        wall_s=wall_s,
        world_size=world_size,
        records=records,
        rank_exitcodes=rank_exitcodes,
        rank_tails={r: tail(rank_log_path(item_dir, r)) for r in range(world_size)},
        launcher_tail=tail(item_dir / "launcher.log"),
        leftovers_killed=sorted(set(leftovers)),
        stale_build_locks_removed=list(stale_locks),
        shm_segments_removed=shm_removed,
        launcher=launcher,
        machine_reason=machine,
        hung=dict(hung or {}),
        logs_cut={log.path.name: log.cut for log in logs if log.cut},
        launched_at=launched_at,
    )
