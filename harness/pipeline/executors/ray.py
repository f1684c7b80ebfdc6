"""``--executor ray``: one Ray task per item, on an existing cluster (``--ray-address``) or a local
one started for the run.

Each task asks for what the item needs (``world_size`` GPUs where the cluster has GPUs, so all of an
item's ranks land on one node; else ``world_size`` CPUs) and Ray places it. On the node it runs
``node.run_on_node``: the cell's environment from the node's cache, the ranks launched as locally,
the record and the item's directory sent back. A small actor on the orchestrator's node notes
where each attempt started, so an attempt whose node (or worker) dies under it is ``ItemLost``
naming that node, and ``Dispatch`` runs it again. Tasks are never retried by Ray itself
(``max_retries=0``): a retry is the run's decision, and recorded.

Ray listens on loopback only where it starts a cluster itself (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``,
set before ``ray`` is imported, for the cluster, its workers and this driver).

An address nothing answers at is refused before the run starts (``check_address``: one line, exit
2, within seconds), where Ray itself would rewrite it and retry for many minutes. Ray connects to
a given address on a thread of its own, waited for at most ``CONNECT_S``: the main thread stays
where a signal reaches it, so Ctrl-C or SIGTERM stops the run at once and ``run.json`` says so, and
an address that accepts a connection but is no Ray cluster is refused in one line too. A local
cluster is started from the main thread (its daemons die with the thread that started them), and
the run's own SIGTERM handler is put back over the one ``ray.init`` installs there.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from harness.core.errors import UserError
from harness.core.json import JsonObject
from harness.core.option import Option
from harness.environments import Resolved
from harness.pipeline.executors.base import Attempted, ExecutorContext, ItemJob, ItemLost, no_placement
from harness.pipeline.executors.node import NodeResult, NodeSettings, run_on_node, unpack_item
from harness.planning.items import PlannedItem
from harness.planning.run_options import ExecutorChoice

#: Ray's namespace for the run's actors (a test finds the tracker there).
NAMESPACE = "ft-regress"
#: Loopback-only clusters (see the module's docstring).
LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
#: At most this many items are submitted to the cluster at once (Ray queues what does not fit).
MOST_IN_FLIGHT = 512
#: How long an address is given to accept a connection before the run starts.
PROBE_S = 5.0
#: How long Ray is given to connect to the cluster (or start a local one).
CONNECT_S = 45.0
#: What ``--ray-address`` takes besides HOST:PORT: Ray's own lookup of the running cluster.
AUTO = "auto"


def check_address(address: str) -> None:
    """Refuse, in one line, an address that is not HOST:PORT (``ray://HOST:PORT``, ``auto``) or that
    nothing accepts a connection at within ``PROBE_S``."""
    if address == AUTO:
        return
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(
            "--ray-address",
            address,
            "is not HOST:PORT",
            "give the Ray head node's address, e.g. --ray-address 10.0.0.5:6379 (or auto)",
        )
    try:
        with socket.create_connection((host, int(port)), timeout=PROBE_S):
            pass
    except OSError as exc:
        if isinstance(exc, socket.gaierror):
            why = f"its host does not resolve ({exc.strerror})"
        elif isinstance(exc, TimeoutError):
            why = f"nothing answered within {PROBE_S:.0f} s"
        else:
            why = exc.strerror or type(exc).__name__
        raise UserError(
            "--ray-address",
            address,
            f"cannot be reached ({why}): no Ray cluster listens there",
            "start the cluster (ray start --head) and give its head's address, or leave --ray-address out "
            "to start a local cluster for the run",
        ) from None


#: The options ``--executor ray`` takes.
OPTIONS = (
    Option(
        "ray_address",
        ("--ray-address",),
        "with --executor ray: the address of a running Ray cluster (host:port, or 'auto'); default: start a "
        "local one for the run",
        metavar="ADDR",
    ),
)


def address(choice: ExecutorChoice) -> str | None:
    """``--ray-address``: the cluster to connect to (None: a local cluster for the run)."""
    given = choice.executor_options.get("ray_address")
    return str(given) if given else None


def check_options(choice: ExecutorChoice) -> None:
    """What can be known of ``--executor ray`` before a run starts: its address answers."""
    given = address(choice)
    if given:
        check_address(given)


class _NotMainThread(logging.Filter):
    """Ray's word that it installed no SIGTERM handler off the main thread: the run keeps its own."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "SIGTERM handler is not set" not in record.getMessage()


def _start_local(ray: Any, init: dict[str, Any]) -> None:
    """A local cluster for the run, started from the main thread (Ray's daemons are bound to the
    thread that starts them); the stop signals stay the run's (``ray.init`` sets its own SIGTERM)."""
    before = signal.getsignal(signal.SIGTERM)
    try:
        ray.init(**init)
    except Exception as exc:  # noqa: BLE001 - said in one line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise UserError(
            "--executor", "ray", f"Ray could not start a local cluster: {first}", "check `ray status`"
        ) from None
    finally:
        if before is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, before)


def _connect(ray: Any, init: dict[str, Any], address: str) -> None:
    """``ray.init`` on a thread of its own, waited for at most ``CONNECT_S`` with the main thread where
    a signal reaches it (Ray blocks in native code while it retries); a refusal is one line."""
    failure: list[BaseException] = []
    done = threading.Event()

    def connect() -> None:
        try:
            ray.init(**init)
        except BaseException as exc:  # noqa: BLE001 - said by the waiting thread
            failure.append(exc)
        finally:
            done.set()

    quiet = _NotMainThread()
    logging.getLogger("ray._private.worker").addFilter(quiet)
    try:
        threading.Thread(target=connect, name="ray-connect", daemon=True).start()
        deadline = time.monotonic() + CONNECT_S
        while not done.wait(0.2):
            if time.monotonic() > deadline:
                raise UserError(
                    "--ray-address",
                    address,
                    f"no Ray cluster answered within {CONNECT_S:.0f} s (the address accepts connections: is it a "
                    "Ray head's GCS port?)",
                    "give the address `ray start --head` printed, or leave --ray-address out to start a local cluster",
                )
    finally:
        logging.getLogger("ray._private.worker").removeFilter(quiet)
    if failure:
        first = (str(failure[0]).strip().splitlines() or [type(failure[0]).__name__])[0][:300]
        raise UserError(
            "--ray-address",
            address,
            f"Ray could not connect: {first}",
            "check the cluster (ray status), or leave --ray-address out to start a local cluster",
        )


def tracker_name(run_id: str) -> str:
    return f"tracker-{run_id}"


class AttemptTracker:
    """Where each attempt started (an actor on the orchestrator's node, which outlives the others)."""

    def __init__(self) -> None:
        self.started_on: dict[str, str] = {}
        self.finished: set[str] = set()

    def started(self, attempt: str, node: str) -> None:
        self.started_on[attempt] = node

    def done(self, attempt: str) -> None:
        self.finished.add(attempt)

    def node_of(self, attempt: str) -> str | None:
        return self.started_on.get(attempt)

    def running(self) -> dict[str, str]:
        """Attempts started and not finished, by attempt id: the node each runs on."""
        return {a: n for a, n in self.started_on.items() if a not in self.finished}


def _attempt_on_node(job: ItemJob, settings: NodeSettings, tracker: Any, attempt: str) -> NodeResult:
    """The task: runs on the node Ray chose."""
    import ray

    node = f"{os.uname().nodename}/{ray.get_runtime_context().get_node_id()[:12]}"
    ray.get(tracker.started.remote(attempt, node))
    try:
        return run_on_node(job, settings, node=node)
    finally:
        tracker.done.remote(attempt)


class RayExecutor:
    name = "ray"
    builds_environments = False
    needs: tuple[str, str] | None = ("ray", "ray")
    options = OPTIONS

    @classmethod
    def check(cls, choice: ExecutorChoice) -> None:
        check_options(choice)

    def __init__(self, context: ExecutorContext) -> None:
        run_dir, run_id = context.run_dir, context.run_id
        for name, value in LOOPBACK.items():
            os.environ.setdefault(name, value)
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.ray: Any = ray
        self.context = context
        self.run_dir = run_dir
        self.run_id = run_id
        cluster = address(context.choice)
        self.started_cluster = cluster is None
        if not ray.is_initialized():
            init: dict[str, Any] = {"namespace": NAMESPACE, "log_to_driver": False, "include_dashboard": False}
            if cluster is not None:
                _connect(ray, {**init, "address": cluster}, cluster)
            else:
                _start_local(ray, init)
        here = ray.get_runtime_context().get_node_id()
        self.tracker: Any = (
            ray.remote(AttemptTracker)
            .options(
                name=tracker_name(run_id),
                namespace=NAMESPACE,
                num_cpus=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=here, soft=False),
            )
            .remote()
        )
        self.task = ray.remote(max_retries=0, retry_exceptions=False)(_attempt_on_node)
        self.settings = NodeSettings.of(context)
        self._refs: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.nodes_used: set[str] = set()
        self.attempts = 0
        self.lost = 0

    def in_flight(self) -> int:
        resources = self.ray.cluster_resources()
        return max(2, min(MOST_IN_FLIGHT, int(resources.get("CPU", 0) + resources.get("GPU", 0))))

    def submit_cell(self, jobs: Sequence[ItemJob]) -> None:
        pass

    def place(self, item: PlannedItem) -> AbstractContextManager[Sequence[str]]:
        return no_placement()

    def demand(self, world_size: int) -> dict[str, float]:
        """The task's resources: the item's ranks' GPUs where the cluster has GPUs, else one CPU per rank."""
        if self.ray.cluster_resources().get("GPU", 0) > 0:
            return {"num_gpus": world_size, "num_cpus": 1}
        return {"num_cpus": world_size}

    def fits_somewhere(self, demand: dict[str, float]) -> bool:
        wanted = {"CPU": demand.get("num_cpus", 0), "GPU": demand.get("num_gpus", 0)}
        for node in self.ray.nodes():
            if node.get("Alive") and all(node["Resources"].get(k, 0) >= v for k, v in wanted.items() if v):
                return True
        return False

    def attempt(self, job: ItemJob, resolved: Resolved | None, gpus: Sequence[str]) -> Attempted:
        from ray import exceptions

        demand = self.demand(job.item.world_size)
        if not self.fits_somewhere(demand):
            raise ItemLost(
                "none",
                f"no live node of the Ray cluster has {demand} for a world size of {job.item.world_size}",
                retry=False,
            )
        attempt = f"{job.item.id.label()}#{secrets.token_hex(4)}"
        ref = self.task.options(**demand).remote(job, self.settings, self.tracker, attempt)
        with self._lock:
            self._refs[attempt] = ref
            self.attempts += 1
        try:
            result: NodeResult = self.ray.get(ref)
        except (exceptions.NodeDiedError, exceptions.WorkerCrashedError, exceptions.ObjectLostError) as exc:
            with self._lock:
                self.lost += 1
            node = self.ray.get(self.tracker.node_of.remote(attempt)) or "not known (it died before the item started)"
            raise ItemLost(node, f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}") from exc
        finally:
            with self._lock:
                self._refs.pop(attempt, None)
        record = unpack_item(result, self.run_dir)
        if result.attempted.node:
            self.nodes_used.add(result.attempted.node)
        return Attempted(record, result.attempted.cell_meta, result.attempted.node)

    def cell_done(self, resolved: Resolved | None) -> None:
        pass

    def abort(self) -> None:
        with self._lock:
            refs = list(self._refs.values())
        for ref in refs:
            self.ray.cancel(ref, force=True)

    def close(self) -> None:
        try:
            self.ray.kill(self.tracker)
        except Exception:  # noqa: BLE001 - the cluster may be gone already
            pass
        self.ray.shutdown()

    def describe(self) -> JsonObject:
        return {
            "name": self.name,
            "address": address(self.context.choice) or "a local cluster started for the run",
            "nodes_used": sorted(self.nodes_used),
            "attempts": self.attempts,
            "lost": self.lost,
        }

    def workers(self) -> JsonObject:
        return {}
