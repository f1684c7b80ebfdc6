"""GPU leases: which GPUs are visible, and that processes leasing at once never share one."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pytest

from harness.execution.gpu_lease import lease, visible_gpus
from harness.execution.launchers.torchrun import torchrun_command


def test_visible_gpus_follow_cuda_visible_devices() -> None:
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "0,2,3"}) == ["0", "2", "3"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb"}) == ["GPU-aa", "GPU-bb"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "1,-1,2"}) == ["1"]  # CUDA stops at an invalid entry


def _hold(args: tuple[str, int, list[str], float]) -> tuple[float, float, list[str]]:
    directory, count, pool, hold_s = args
    with lease(count, pool, Path(directory), poll_s=0.02) as gpus:
        start = time.monotonic()
        time.sleep(hold_s)
        return start, time.monotonic(), gpus


def test_concurrent_leases_are_disjoint_sized_and_all_served(tmp_path: Path) -> None:
    pool = ["0", "1", "2", "3"]
    wanted = [2, 1, 3, 2, 1, 4, 2, 1]
    with multiprocessing.get_context("spawn").Pool(len(wanted)) as workers:
        spans = workers.map(_hold, [(str(tmp_path), n, pool, 0.3) for n in wanted])
    for (_, _, gpus), n in zip(spans, wanted, strict=True):
        assert len(gpus) == n and len(set(gpus)) == n and set(gpus) <= set(pool)
    for i, (s1, e1, g1) in enumerate(spans):
        for s2, e2, g2 in spans[i + 1 :]:
            if s1 < e2 and s2 < e1:
                assert not set(g1) & set(g2), "a GPU was lent twice at once"


def test_a_lease_is_released_and_more_than_the_pool_is_refused(tmp_path: Path) -> None:
    with lease(2, ["0", "1"], tmp_path) as first:
        assert sorted(first) == ["0", "1"]
    with lease(2, ["0", "1"], tmp_path) as again:
        assert sorted(again) == ["0", "1"]
    with pytest.raises(ValueError):
        with lease(3, ["0", "1"], tmp_path):
            pass
    with lease(0, [], tmp_path) as none:
        assert none == []


def test_torchrun_never_uses_a_fixed_port() -> None:
    """Concurrent items (xdist workers, shards on one box) cannot collide on a port:
    --standalone makes torchrun bind its rendezvous to a port the OS picks."""
    command = torchrun_command("python", "repros.x", "bug", 2, Path("/tmp/item"))
    assert "--standalone" in command
    assert not any(
        a.startswith(("--master_port", "--master-port", "--rdzv_endpoint", "--rdzv-endpoint")) for a in command
    )
