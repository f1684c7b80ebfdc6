"""Items per minute by executor, on this machine: the same selection run locally (``--jobs 0``: as
many at once as the cores fit) and on a Ray cluster of one node and of two nodes started here
(Ray's ``cluster_utils.Cluster``, loopback only; the cluster's start is not counted, as a real
cluster is already up), each run in its own subprocess on warm environments.

    python -m harness bench executors [--cells current] [--repros F1,F3] [--cpus-per-node 2]

Prints, per executor: the items, the run's wall time, items per minute, the sum of the items' own
wall times and the time outside them (the run's fixed cost: connecting, the nodes' first worker,
shipping records and files back); writes ``executor-bench.json`` into ``--out``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from harness.core.json import JsonObject
from harness.pipeline.executors.ray import LOOPBACK


@dataclass(frozen=True)
class ExecutorFigures:
    executor: str
    items: int
    wall_s: float
    items_per_minute: float
    items_wall_s: float
    outside_items_s: float
    matched: int
    nodes: list[str]


def _run(selection: Sequence[str], out: Path, *more: str) -> tuple[float, Path]:
    command = [sys.executable, "-m", "harness", "run", *selection, "--out", str(out), *more]
    started = time.perf_counter()
    done = subprocess.run(command, env={**os.environ, **LOOPBACK}, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if done.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return wall, out


def figures(executor: str, wall: float, out: Path) -> ExecutorFigures:
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]
    items_wall = sum(r.get("wall_s") or 0.0 for r in records)
    return ExecutorFigures(
        executor=executor,
        items=len(records),
        wall_s=round(wall, 1),
        items_per_minute=round(60 * len(records) / wall, 2) if wall else 0.0,
        items_wall_s=round(items_wall, 1),
        outside_items_s=round(wall - items_wall, 1),
        matched=sum(1 for r in records if r.get("matched")),
        nodes=sorted({r["node"] for r in records if r.get("node")}),
    )


@contextmanager
def ray_cluster(nodes: int, cpus_per_node: int) -> Iterator[str]:
    os.environ.update(LOOPBACK)
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    try:
        for _ in range(nodes):
            cluster.add_node(num_cpus=cpus_per_node)
        cluster.wait_for_nodes()
        yield cluster.address
    finally:
        cluster.shutdown()


def measure(selection: Sequence[str], work: Path, cpus_per_node: int) -> list[ExecutorFigures]:
    found = []
    wall, out = _run(selection, work / "local", "--jobs", "0")
    found.append(figures("local (--jobs 0)", wall, out))
    for nodes in (1, 2):
        with ray_cluster(nodes, cpus_per_node) as address:
            wall, out = _run(selection, work / f"ray-{nodes}", "--executor", "ray", "--ray-address", address)
        found.append(figures(f"ray, {nodes} node{'s' if nodes > 1 else ''}", wall, out))
    return found


def run_executor_bench(selection: Sequence[str], work: Path, cpus_per_node: int, console: Console) -> Path:
    """Warm the selection's environments, time it by executor, print the table; the JSON's path."""
    work.mkdir(parents=True, exist_ok=True)
    _run(selection, work / "warm-up")  # environments built before anything is timed
    found = measure(selection, work, cpus_per_node)
    table = Table(title=f"items per minute by executor ({' '.join(selection)})")
    for column in ("executor", "items", "wall s", "items/min", "items' own s", "outside items s", "matched", "nodes"):
        table.add_column(column)
    for f in found:
        table.add_row(
            f.executor,
            str(f.items),
            f"{f.wall_s:.1f}",
            f"{f.items_per_minute:.2f}",
            f"{f.items_wall_s:.1f}",
            f"{f.outside_items_s:.1f}",
            str(f.matched),
            str(len(f.nodes) or "-"),
        )
    console.print(table)
    summary: JsonObject = {"selection": list(selection), "cpus": os.cpu_count(), "runs": [asdict(f) for f in found]}
    written = work / "executor-bench.json"
    written.write_text(json.dumps(summary, indent=2))
    console.print(f"written: {written}", highlight=False)
    return written
