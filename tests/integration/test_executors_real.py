"""Items on a cluster, for real: a lane across a two-node Ray cluster on this machine (Ray's own
``ray.cluster_utils.Cluster``, loopback only), one node killed while an item runs on it; and the
same lane as Slurm jobs through submitit's local executor, one job killed mid-item (no Slurm
daemon runs on the CI machine: see docs/scale-out.md).

Each run must give every planned item exactly one record; the killed item an INFRA attempt that
names the lost node, then a record from its retry; and every outcome equal to a local run's."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.support.cluster_runs import LOOPBACK, harness_run, outcomes, records

pytestmark = pytest.mark.integration


def run_id(out: Path, deadline: float) -> str:
    while time.monotonic() < deadline:
        meta = out / "run.json"
        if meta.exists():
            try:
                return json.loads(meta.read_text())["run_id"]
            except (json.JSONDecodeError, KeyError):
                pass
        time.sleep(0.2)
    raise AssertionError(f"{out}/run.json was never written")


@pytest.fixture(scope="module")
def local_outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str, str], str]:
    out = tmp_path_factory.mktemp("local") / "out"
    proc = harness_run(out)
    log, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, log[-3000:]
    return outcomes(records(out))


def check_killed_and_retried(out: Path, local: dict[tuple[str, str, str], str], killed_node: str) -> None:
    found = records(out)
    keys = [(r["cell"], r["repro"], r["mode"]) for r in found]
    assert sorted(keys) == sorted(local), "every planned item has exactly one record"
    assert len(set(keys)) == len(keys)
    lost = [r for r in found if any(a.get("error_type") == "NodeLost" for a in r.get("attempts", []))]
    assert lost, "the item running on the killed node was run again, its lost attempt kept"
    for record in lost:
        first = record["attempts"][0]
        assert first["outcome"] == "INFRA"
        assert killed_node in first["message"], first["message"]
        assert any("run again after its node was lost" in reason for reason in record["reasons"])
    assert outcomes(found) == local, "outcomes equal a local run's"


def test_a_lane_on_a_two_node_ray_cluster_survives_a_node_killed_mid_item(
    tmp_path: Path, local_outcomes: dict[tuple[str, str, str], str]
) -> None:
    os.environ.update(LOOPBACK)
    import ray
    from ray.cluster_utils import Cluster

    from harness.pipeline.executors.ray import NAMESPACE, tracker_name

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    try:
        nodes = [cluster.add_node(num_cpus=2) for _ in range(2)]
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, namespace=NAMESPACE)
        out = tmp_path / "ray"
        proc = harness_run(out, "--executor", "ray", "--ray-address", cluster.address)
        deadline = time.monotonic() + 600
        tracker_of = tracker_name(run_id(out, deadline))
        victim = nodes[1]
        killed = None
        while killed is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                running = ray.get(ray.get_actor(tracker_of, namespace=NAMESPACE).running.remote())
            except ValueError:  # the actor is not there yet
                running = {}
            if any(victim.node_id[:12] in node for node in running.values()):
                cluster.remove_node(victim, allow_graceful=False)
                killed = victim.node_id[:12]
            time.sleep(0.5)
        assert killed is not None, "no item ever ran on the second node"
        log, _ = proc.communicate(timeout=max(60, deadline - time.monotonic()))
        assert proc.returncode == 0, log[-3000:]
        check_killed_and_retried(out, local_outcomes, killed)
        meta = json.loads((out / "run.json").read_text())
        assert meta["concurrency"]["executor"] == "ray"
        assert meta["concurrency"]["lost"] >= 1
        assert "current" in meta["cells"], "the node's environment is in run.json"
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_a_lane_as_submitit_jobs_survives_a_job_killed_mid_item(
    tmp_path: Path, local_outcomes: dict[tuple[str, str, str], str]
) -> None:
    out = tmp_path / "slurm"
    proc = harness_run(out, "--executor", "slurm", "--slurm-param", "cluster=local", "--jobs", "2")
    deadline = time.monotonic() + 600
    markers = out / "slurm" / "nodes"
    killed = None
    while killed is None and time.monotonic() < deadline and proc.poll() is None:
        # A job writes its node down as it starts; kill the first job that has one, mid-item.
        started = sorted(markers.glob("*")) if markers.exists() else []
        if started:
            time.sleep(2)
            job_pids = [p for p in _submitit_jobs() if str(out) in _cmdline(p)]
            if job_pids:
                os.kill(job_pids[0], signal.SIGKILL)
                killed = started[0].read_text()
        time.sleep(0.5)
    assert killed is not None, "no job ever started"
    log, _ = proc.communicate(timeout=max(60, deadline - time.monotonic()))
    assert proc.returncode == 0, log[-3000:]
    check_killed_and_retried(out, local_outcomes, killed)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _submitit_jobs() -> list[int]:
    return [
        int(p.name)
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and "submitit.core._submit" in _cmdline(int(p.name))
    ]
