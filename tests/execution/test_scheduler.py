"""--jobs: never more ranks than cores (or GPUs, or memory), never a deadlock."""

from __future__ import annotations

import threading
import time

import pytest

from harness.execution.scheduler import MEMORY_PER_RANK_BYTES, Demand, Machine, Slots, available_memory, items_at_once

GIB = 2**30
TWO_CORES = Machine(cpus=2, memory_bytes=24 * GIB)
GPU_BOX = Machine(cpus=96, memory_bytes=1024 * GIB, gpus=tuple(str(i) for i in range(8)))


def test_two_rank_items_on_two_cores_run_one_at_a_time_whatever_jobs_says() -> None:
    demand = Demand.for_item(2, TWO_CORES)
    assert (demand.cpus, demand.gpus) == (2, 0)
    assert items_at_once(TWO_CORES, demand, jobs=2) == 1
    assert items_at_once(TWO_CORES, Demand.for_item(1, TWO_CORES), jobs=0) == 2


def test_gpus_bound_a_gpu_box_and_jobs_caps_it() -> None:
    demand = Demand.for_item(2, GPU_BOX)
    assert demand.gpus == 2
    assert items_at_once(GPU_BOX, demand, jobs=0) == 4
    assert items_at_once(GPU_BOX, demand, jobs=3) == 3


def test_memory_bounds_a_machine_with_many_cores_and_little_memory() -> None:
    machine = Machine(cpus=64, memory_bytes=5 * MEMORY_PER_RANK_BYTES)
    assert items_at_once(machine, Demand.for_item(2, machine), jobs=0) == 2


def test_available_memory_reads_meminfo(tmp_path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 100 kB\nMemAvailable:   2048 kB\n")
    assert available_memory(str(meminfo)) == 2048 * 1024


def _run_concurrently(slots: Slots, demands: list[Demand], hold_s: float = 0.05) -> tuple[int, list[list[str]]]:
    """Run one thread per demand through ``slots``; return the most at once and the GPUs each got."""
    lock = threading.Lock()
    running = most = 0
    got: list[list[str]] = []

    def item(demand: Demand) -> None:
        nonlocal running, most
        with slots.hold(demand) as gpus:
            with lock:
                running += 1
                most = max(most, running)
                got.append(gpus)
            time.sleep(hold_s)
            with lock:
                running -= 1

    threads = [threading.Thread(target=item, args=(d,)) for d in demands]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads), "an item never got its slot"
    return most, got


@pytest.mark.parametrize(("jobs", "expected"), [(1, 1), (2, 2), (0, 3), (8, 3)])
def test_slots_hold_at_most_what_jobs_and_cores_allow(jobs: int, expected: int) -> None:
    machine = Machine(cpus=6, memory_bytes=64 * GIB)
    most, _ = _run_concurrently(Slots(machine, jobs), [Demand.for_item(2, machine)] * 7)
    assert most == expected


def test_concurrent_items_get_disjoint_gpus() -> None:
    machine = Machine(cpus=32, memory_bytes=64 * GIB, gpus=("0", "1", "2", "3"))
    most, got = _run_concurrently(Slots(machine, 0), [Demand.for_item(2, machine)] * 6, hold_s=0.1)
    assert most == 2 and all(len(g) == 2 for g in got)


def test_an_item_bigger_than_the_machine_runs_alone_instead_of_never() -> None:
    slots = Slots(TWO_CORES, 0)
    most, _ = _run_concurrently(slots, [Demand.for_item(4, TWO_CORES), Demand.for_item(1, TWO_CORES)])
    assert most == 1 and slots.peak == 1
