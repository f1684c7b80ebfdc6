"""One attempt of one item on a cluster's node: the function every remote executor runs there.

The node makes the cell's environment ready in its own cache (or the shared one the user named:
``--cache-dir``), keyed as locally, so a cell's environment is built once per node and reused by
every item of it there; a lock per environment keeps two items on one node from building it twice.
The ranks are launched on the node exactly as locally: the local executor's attempt, with the
node's launcher and environments, into a scratch run directory of the node's own; the item's
directory comes back packed with the record, and the orchestrator unpacks it into the run
directory (``unpack_item``): it alone writes there.
"""

from __future__ import annotations

import atexit
import io
import os
import shutil
import socket
import tarfile
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness.environments import Environment, Environments
from harness.environments.base import default_cache_dir
from harness.execution.gpu_lease import visible_gpus
from harness.execution.launchers import Launcher, LauncherContext, make_launcher
from harness.pipeline.cell_state import cell_meta
from harness.pipeline.executors.base import Attempted, ExecutorContext, ItemJob
from harness.pipeline.executors.local import LocalExecutor
from harness.planning.run_options import CacheChoice, ExecutorChoice
from harness.records.item import ItemRecord
from harness.records.run_dir import RunDir

#: An item's files are packed only up to this size (logs are already capped by the launcher).
MAX_PACKED_BYTES = 256 * 2**20
#: A node's process keeps the launcher resources (a pre-imported worker) of this many cells at most.
CELLS_KEPT = 2


@dataclass(frozen=True)
class NodeSettings:
    """How a node runs items: where its environments live, and which launcher starts the ranks."""

    launcher: str
    cache_dir: Path | None = None
    cache_max_gb: float | None = None

    @classmethod
    def of(cls, context: ExecutorContext) -> NodeSettings:
        """The nodes' settings for a run: its launcher, and the cache the user named (else each node's own)."""
        return cls(context.choice.launcher, context.node_cache_dir, context.cache.cache_max_gb)


@dataclass(frozen=True)
class NodeResult:
    """What comes back from a node: the attempt and the item's directory, packed (tar.gz)."""

    attempted: Attempted
    packed_item_dir: bytes


def node_name() -> str:
    return socket.gethostname()


@dataclass
class NodeProcess:
    """What one process on a node keeps between the items it runs (Ray reuses a worker process for
    many tasks): the environments, held while the process keeps them, and one launcher, so a cell's
    pre-imported worker serves every item of the cell this process runs, as locally. The launcher's
    resources of the least recently used cell go when a ``CELLS_KEPT + 1``-th cell comes."""

    environments: Environments
    launcher: Launcher
    scratch: Path
    recent: OrderedDict[str, Environment] = field(default_factory=OrderedDict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def used(self, env: Environment) -> None:
        with self.lock:
            self.recent[env.key] = env
            self.recent.move_to_end(env.key)
            while len(self.recent) > CELLS_KEPT:
                _, old = self.recent.popitem(last=False)
                self.launcher.cell_done(old)
                self.environments.release(old)

    def close(self) -> None:
        self.launcher.close()
        for env in self.recent.values():
            self.environments.release(env)
        shutil.rmtree(self.scratch, ignore_errors=True)


_PROCESSES: dict[NodeSettings, NodeProcess] = {}
_PROCESSES_LOCK = threading.Lock()


def node_process(settings: NodeSettings) -> NodeProcess:
    """This process's state for ``settings``, made on its first item (closed when the process exits)."""
    with _PROCESSES_LOCK:
        if settings not in _PROCESSES:
            scratch = Path(tempfile.mkdtemp(prefix="ft-regress-node-"))
            environments = Environments(settings.cache_dir or default_cache_dir(), cache_max_gb=settings.cache_max_gb)
            launcher = make_launcher(settings.launcher, LauncherContext(log_dir=scratch / "workers"))
            if not _PROCESSES:
                atexit.register(close_node_processes)
            _PROCESSES[settings] = NodeProcess(environments, launcher, scratch)
        return _PROCESSES[settings]


def close_node_processes() -> None:
    with _PROCESSES_LOCK:
        for state in _PROCESSES.values():
            state.close()
        _PROCESSES.clear()


def run_on_node(
    job: ItemJob, settings: NodeSettings, node: str | None = None, gpus: Sequence[str] | None = None
) -> NodeResult:
    """Run one attempt of ``job`` here and return its record and files. ``node`` names this node in
    the record (default: the host name); ``gpus`` are the GPUs the cluster gave the item (default:
    ``CUDA_VISIBLE_DEVICES`` as the cluster set it)."""
    here = node or node_name()
    state = node_process(settings)
    resolved = state.environments.for_cell(job.item.cell)
    if resolved.env is not None:
        state.used(resolved.env)
    scratch = Path(tempfile.mkdtemp(prefix=f"{job.run_id}-", dir=state.scratch))
    try:
        run_dir = RunDir(scratch)
        context = ExecutorContext(
            run_dir=run_dir,
            run_id=job.run_id,
            choice=ExecutorChoice(launcher=settings.launcher),
            cache=CacheChoice(cache_dir=settings.cache_dir, cache_max_gb=settings.cache_max_gb),
            environments=state.environments,
        )
        here_gpus = list(visible_gpus()) if gpus is None else list(gpus)
        record = LocalExecutor(context, launcher=state.launcher).attempt(job, resolved, here_gpus).record
        record = record.evolve(node=here)
        packed = _pack(run_dir.item_dir(job.item.id))
        return NodeResult(Attempted(record, cell_meta(job.item.cell, resolved), here), packed)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _pack(item_dir: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        if item_dir.is_dir():
            size = 0
            for path in sorted(item_dir.rglob("*")):
                if path.is_file() and not path.is_symlink():
                    size += path.stat().st_size
                    if size > MAX_PACKED_BYTES:
                        break
                    tar.add(path, arcname=str(path.relative_to(item_dir)), recursive=False)
    return buffer.getvalue()


def unpack_item(result: NodeResult, run_dir: RunDir) -> ItemRecord:
    """Write the item's files from the node into the run directory; the record, pointing there."""
    record = result.attempted.record
    item_dir = run_dir.item_dir(record.id)
    if item_dir.exists():
        shutil.rmtree(item_dir)
    item_dir.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(result.packed_item_dir), mode="r:gz") as tar:
        tar.extractall(item_dir, filter="data")
    os.utime(item_dir)
    return record.evolve(item_dir=str(item_dir))
