"""``--executor slurm``: items as Slurm jobs through submitit, one job array per cell.

Each job runs ``node.run_on_node`` on the node Slurm gave it: the cell's environment from the
node's cache (or the shared ``--cache-dir``), the ranks launched there as locally, under the
cell environment's own Python; the job's function itself runs under the orchestrator's Python, which
every node must see at the same path (a shared install, as submitit requires). Its record and files
come back through submitit's folder (``--slurm-folder``, default the run directory's ``slurm``),
and the orchestrator, the only writer of the run directory, collects them.

A job that ends without a result (its node failed, it was preempted, cancelled or killed) is
``ItemLost``, naming the node it wrote down when it started, and the item runs again as one job.

``--slurm-param`` passes submitit's parameters (``slurm_partition=gpu``, ``timeout_min=90``, ...).
Two are the harness's own: ``cluster=local`` runs jobs as processes on this machine (submitit's
local executor, what the tests use where no Slurm runs), and ``gpu=true`` asks for ``world_size``
GPUs per job (else ``world_size`` CPUs).

Where no Slurm is found, submitit would quietly run every job on this machine: ``--executor slurm``
is refused there instead (``check_options``), unless ``cluster=local`` asks for exactly that; a run
that does says so as it starts, and ``run.json`` records the cluster it ran on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from harness.core.errors import UserError
from harness.core.json import JsonObject
from harness.core.option import Option
from harness.environments import Resolved
from harness.pipeline.executors.base import Attempted, ExecutorContext, ItemJob, ItemLost, no_placement
from harness.pipeline.executors.node import NodeResult, NodeSettings, run_on_node, unpack_item
from harness.planning.items import PlannedItem
from harness.planning.run_options import ExecutorChoice

#: Items waited on at once on a real cluster (Slurm queues the rest; ``slurm_array_parallelism`` limits them).
MOST_IN_FLIGHT = 512
#: A job's limit where ``--slurm-param timeout_min`` does not say (items have their own, shorter, timeouts).
DEFAULT_TIMEOUT_MIN = 120
#: A job is waited on this long past its own limit before it is given up as lost: where ``sacct``
#: does not answer (a cluster without accounting), submitit never learns that a killed job ended.
WAIT_GRACE_S = 300
#: How often a job's state is asked for.
POLL_S = 2.0
#: The harness's own parameters, not submitit's.
OWN_PARAMETERS = ("cluster", "gpu")


#: The options ``--executor slurm`` takes.
OPTIONS = (
    Option(
        "slurm_folder",
        ("--slurm-folder",),
        "with --executor slurm: where submitit keeps its jobs' files, a folder every node sees (default: "
        "the run directory's 'slurm')",
        kind="path",
    ),
    Option(
        "slurm_param",
        ("--slurm-param",),
        "with --executor slurm: submitit parameters NAME=VALUE, comma-separated (repeatable; e.g. "
        "slurm_partition=gpu,timeout_min=60, or cluster=local for submitit's local executor)",
        kind="csv",
        metavar="NAME=VALUE",
    ),
)


def parameters(choice: ExecutorChoice) -> list[tuple[str, str]]:
    """``--slurm-param``: each submitit parameter, name and value; a ``UserError`` for one that is not
    NAME=VALUE."""
    given = choice.executor_options.get("slurm_param")
    pairs = []
    for entry in given if isinstance(given, list) else []:
        key, sep, value = str(entry).partition("=")
        if not sep or not key.strip():
            raise UserError("--slurm-param", str(entry), "is not NAME=VALUE", "e.g. --slurm-param slurm_partition=gpu")
        pairs.append((key.strip(), value.strip()))
    return pairs


def folder(choice: ExecutorChoice) -> Path | None:
    """``--slurm-folder``: where submitit keeps its jobs' files (None: the run directory's)."""
    given = choice.executor_options.get("slurm_folder")
    return Path(str(given)) if given else None


def check_options(choice: ExecutorChoice) -> None:
    """``--slurm-param`` that is not NAME=VALUE; ``--executor slurm`` where submitit finds no Slurm (no
    ``srun`` on PATH) and ``cluster`` is not named: refused in one line, never run on this machine
    without a word."""
    named = dict(parameters(choice)).get("cluster")
    if named:
        return
    import submitit

    try:
        found = submitit.AutoExecutor.which()
    except RuntimeError:
        found = None
    if found != "slurm":
        raise UserError(
            "--executor",
            "slurm",
            "finds no Slurm here (no srun on PATH): submitit would run every item on this machine instead",
            "run it where Slurm is, or ask for that with --slurm-param cluster=local (submitit's local executor)",
        )


def slurm_job_id(environ: Mapping[str, str]) -> str | None:
    """The job's id as ``squeue``, ``sacct`` and submitit write it: ``ARRAY_TASK`` for a task of an
    array (its own ``SLURM_JOB_ID`` is another number), else the job's id."""
    array, task = environ.get("SLURM_ARRAY_JOB_ID"), environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return environ.get("SLURM_JOB_ID")


def cancellation_ends_the_job() -> None:
    """A job Slurm stops (``scancel``, a node drained, preemption, its time limit) ends with it, without a
    result: submitit's job process lets SIGTERM by (it waits for a requeue signal that the harness never
    asks for), so an item whose installer or ranks the signal had already killed finished anyway, with
    what their deaths looked like (an environment "without saying why", UNRESOLVABLE) as its record.
    Ended by SIGTERM, the job has no result and its item is ``ItemLost``, run again."""
    if threading.current_thread() is threading.main_thread():  # only there can a handler be set
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _job_main(job: ItemJob, settings: NodeSettings, marker: str) -> NodeResult:
    """The job: runs on the node Slurm chose (or, ``cluster=local``, a process here)."""
    cancellation_ends_the_job()
    node = socket.gethostname()
    job_id = slurm_job_id(os.environ)
    if job_id:
        node += f"/job {job_id}"
    Path(marker).write_text(node)
    return run_on_node(job, settings, node=node)


def host_of(node: str) -> str:
    """The machine in a node's name (``vm/job 7_0`` -> ``vm``)."""
    return node.split("/job ", 1)[0]


def _value(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


class SlurmExecutor:
    name = "slurm"
    builds_environments = False
    needs: tuple[str, str] | None = ("submitit", "slurm")
    options = OPTIONS

    @classmethod
    def check(cls, choice: ExecutorChoice) -> None:
        check_options(choice)

    def __init__(self, context: ExecutorContext) -> None:
        run_dir = context.run_dir
        import submitit

        self.submitit: Any = submitit
        self.context = context
        self.run_dir = run_dir
        given = {k: _value(v) for k, v in parameters(context.choice)}
        cluster = given.pop("cluster", None)
        self.gpu = str(given.pop("gpu", "false")).lower() in ("1", "true", "yes")
        given.setdefault("timeout_min", DEFAULT_TIMEOUT_MIN)
        self.parameters = given
        self.folder = (folder(context.choice) or run_dir.path / "slurm").resolve()
        self.markers = self.folder / "nodes"
        self.markers.mkdir(parents=True, exist_ok=True)
        self.executor: Any = submitit.AutoExecutor(folder=self.folder / "%j", cluster=cluster)
        self.cluster: str = self.executor.cluster
        self.settings = NodeSettings.of(context)
        self._submitting = threading.Lock()
        self._lock = threading.Lock()
        #: The job each item's first attempt was submitted as (with its cell's array).
        self._first: dict[str, tuple[Any, Path]] = {}
        self._running: dict[str, Any] = {}
        self.nodes_used: set[str] = set()
        self.jobs_submitted = 0
        self.lost = 0

    @property
    def arrays(self) -> bool:
        """Whether a cell's items go in as one job array (on Slurm); submitit's local executor starts
        every job of an array at once, so there each attempt is submitted as a thread frees up."""
        return self.cluster != "local"

    def in_flight(self) -> int:
        return MOST_IN_FLIGHT if self.arrays else max(1, self.context.choice.jobs or 1)

    def _resources(self, world_size: int) -> dict[str, Any]:
        wanted: dict[str, Any] = {"nodes": 1, "tasks_per_node": 1, "name": "ft-regress"}
        if self.gpu:
            wanted.update(gpus_per_node=world_size, cpus_per_task=world_size)
        elif self.cluster != "local":
            wanted["cpus_per_task"] = world_size
        return {**wanted, **self.parameters}

    def _marker(self, job: ItemJob) -> Path:
        label = job.item.id.label().replace("/", "__")
        return self.markers / f"{label}.{os.urandom(4).hex()}"

    def submit_cell(self, jobs: Sequence[ItemJob]) -> None:
        if not self.arrays:
            return
        by_world: dict[int, list[ItemJob]] = {}
        for job in jobs:
            by_world.setdefault(job.item.world_size, []).append(job)
        with self._submitting:
            for world_size, group in by_world.items():
                self.executor.update_parameters(**self._resources(world_size))
                markers = [self._marker(job) for job in group]
                with self.executor.batch():
                    handles = [
                        self.executor.submit(_job_main, job, self.settings, str(marker))
                        for job, marker in zip(group, markers, strict=True)
                    ]
                with self._lock:
                    self.jobs_submitted += len(group)
                    for job, handle, marker in zip(group, handles, markers, strict=True):
                        self._first[job.item.id.label()] = (handle, marker)

    def _submit_one(self, job: ItemJob) -> tuple[Any, Path]:
        marker = self._marker(job)
        with self._submitting:
            self.executor.update_parameters(**self._resources(job.item.world_size))
            handle = self.executor.submit(_job_main, job, self.settings, str(marker))
        with self._lock:
            self.jobs_submitted += 1
        return handle, marker

    def place(self, item: PlannedItem) -> AbstractContextManager[Sequence[str]]:
        return no_placement()

    def attempt(self, job: ItemJob, resolved: Resolved | None, gpus: Sequence[str]) -> Attempted:
        label = job.item.id.label()
        with self._lock:
            first = self._first.pop(label, None)
        handle, marker = first if first is not None else self._submit_one(job)
        with self._lock:
            self._running[f"{label}:{handle.job_id}"] = handle
        utils = self.submitit.core.utils
        try:
            result: NodeResult = handle.result()
        except utils.UncompletedJobError as exc:
            with self._lock:
                self.lost += 1
            node = marker.read_text() if marker.exists() else "not known (the job ended before the item started)"
            raise ItemLost(
                node, f"job {handle.job_id} ended without a result: {str(exc).splitlines()[0][:300]}"
            ) from exc
        except utils.FailedJobError as exc:
            node = marker.read_text() if marker.exists() else "not known"
            tail = str(exc).strip().splitlines()[-1][:300] if str(exc).strip() else type(exc).__name__
            raise ItemLost(
                node, f"job {handle.job_id} failed: {tail}", retry=False, error_type="NodeJobFailed"
            ) from exc
        finally:
            with self._lock:
                self._running.pop(f"{label}:{handle.job_id}", None)
        record = unpack_item(result, self.run_dir)
        if result.attempted.node:
            self.nodes_used.add(host_of(result.attempted.node))
        return Attempted(record, result.attempted.cell_meta, result.attempted.node)

    def _wait(self, handle: Any, marker: Path) -> None:
        """Until the job is done; a job running longer than its time limit and ``WAIT_GRACE_S`` more
        (Slurm would have ended it: its end was never seen) is cancelled and lost. The clock starts
        when the job does (it writes its marker): a job waiting in the queue waits as long as it must."""
        limit_s = float(self.parameters.get("timeout_min", DEFAULT_TIMEOUT_MIN)) * 60 + WAIT_GRACE_S
        started: float | None = None
        while not handle.done():
            if started is None and marker.exists():
                started = time.monotonic()
            if started is not None and time.monotonic() - started > limit_s:
                with contextlib.suppress(Exception):
                    handle.cancel(check=False)
                with self._lock:
                    self.lost += 1
                node = marker.read_text()
                raise ItemLost(
                    node,
                    f"job {handle.job_id} was not seen to end within its time limit and {WAIT_GRACE_S} s more "
                    "(does `sacct` answer on this cluster? submitit reads job states from Slurm's accounting)",
                )
            time.sleep(POLL_S)

    def cell_done(self, resolved: Resolved | None) -> None:
        pass

    def abort(self) -> None:
        with self._lock:
            handles = list(self._running.values()) + [h for h, _ in self._first.values()]
            self._first.clear()
        for handle in handles:
            try:
                handle.cancel(check=False)
            except Exception:  # noqa: BLE001 - a job already gone
                pass

    def close(self) -> None:
        self.abort()

    def describe(self) -> JsonObject:
        local = (
            {
                "note": f"--executor slurm with cluster={self.cluster}: submitit runs every item on this machine, "
                "not through Slurm"
            }
            if self.cluster != "slurm"
            else {}
        )
        return {
            "name": self.name,
            **local,
            "cluster": self.cluster,
            "folder": str(self.folder),
            "nodes_used": sorted(self.nodes_used),
            "jobs_submitted": self.jobs_submitted,
            "lost": self.lost,
        }

    def workers(self) -> JsonObject:
        return {}
