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
"""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from harness.environments import Resolved
from harness.pipeline.executors.base import Attempted, ExecutorContext, ItemJob, ItemLost, no_placement
from harness.pipeline.executors.node import NodeResult, NodeSettings, run_on_node, unpack_item
from harness.planning.items import PlannedItem
from harness.records.run_dir import RunDir

#: Ray's namespace for the run's actors (a test finds the tracker there).
NAMESPACE = "ft-regress"
#: Loopback-only clusters (see the module's docstring).
LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
#: At most this many items are submitted to the cluster at once (Ray queues what does not fit).
MOST_IN_FLIGHT = 512


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

    def __init__(self, context: ExecutorContext, run_dir: RunDir, run_id: str) -> None:
        for name, value in LOOPBACK.items():
            os.environ.setdefault(name, value)
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.ray: Any = ray
        self.context = context
        self.run_dir = run_dir
        self.run_id = run_id
        self.started_cluster = context.ray_address is None
        if not ray.is_initialized():
            init: dict[str, Any] = {"namespace": NAMESPACE, "log_to_driver": False, "include_dashboard": False}
            if context.ray_address is not None:
                init["address"] = context.ray_address
            ray.init(**init)
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
        self.settings = NodeSettings(
            launcher=context.launcher, cache_dir=context.node_cache_dir, cache_max_gb=context.cache_max_gb
        )
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

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "address": self.context.ray_address or "a local cluster started for the run",
            "nodes_used": sorted(self.nodes_used),
            "attempts": self.attempts,
            "lost": self.lost,
        }

    def workers(self) -> dict[str, Any]:
        return {}
