"""What a rank measures, taken for real in this process (the CPU paths need no torch)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from harness.execution.metrics import summarise
from harness.records.item import ItemRecord
from repros.runtime.context import Meters
from repros.runtime.measures import measures
from repros.runtime.measures.step_cpu_time import StepCpuTime
from repros.runtime.measures.train_peak_memory import TrainPeakMemory
from tests.support.rank_records import rank_record

CPU = SimpleNamespace(type="cpu")
MIB = 2**20


def test_the_training_peak_counts_what_training_allocates_not_what_was_there_before() -> None:
    before = bytearray(80 * MIB)  # imports, the model: in the baseline
    before[::4096] = b"x" * len(before[::4096])
    meter = TrainPeakMemory(CPU)
    meter.training_begins()
    during = bytearray(64 * MIB)
    during[::4096] = b"y" * len(during[::4096])  # touch every page
    del during  # freed before the end: a peak, not a level
    result = meter.result()
    assert result is not None and result["kind"] in ("cpu_rss_hwm_above_baseline", "cpu_rss_sampled_above_baseline")
    if result["kind"] == "cpu_rss_hwm_above_baseline":
        assert 56 * MIB <= result["value"] < 80 * MIB + 64 * MIB, result  # the 64 MiB, not the 80 before
    del before


def test_cpu_time_per_step_counts_work_not_waiting() -> None:
    meter = StepCpuTime(CPU)
    meter.resume()
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:
        pass
    meter.pause()
    meter.end_step()
    meter.resume()
    time.sleep(0.1)  # waiting costs no CPU
    meter.pause()
    meter.end_step()
    busy, idle = meter.per_step
    assert busy >= 0.045 and idle < 0.02


def test_every_measure_lands_in_the_record_under_its_declared_field() -> None:
    meters = Meters.for_device(CPU)
    meters.training_begins()
    for _ in range(3):
        meters.resume()
        meters.pause()
        meters.end_step()
    results = meters.results()
    figures = summarise([rank_record(r, warmup_steps=1, measures=results) for r in (0, 1)])
    assert set(figures) == {measure.name for measure in measures()}
    record = ItemRecord.model_validate(
        {
            "schema_version": 1,
            "run_id": "run",
            "cell": "c",
            "repro": "F1",
            "mode": "bug",
            "outcome": "PASS",
            "signature": None,
            "expected": None,
            "matched": False,
            "versions": {},
            "world_size": 2,
            "device": "cpu",
            "figures": figures,
            "wall_s": 1.0,
            "error": None,
            "reasons": [],
            "guards": [],
            "env": None,
            "repro_cmd": "",
            "started_at": "2026-11-20T10:00:00+00:00",
            "finished_at": "2026-11-20T10:00:01+00:00",
        }
    )
    fields = record.as_json()  # as results.jsonl holds it
    for measure in measures():
        assert measure.field in fields
    assert fields["step_time_s"]["n"] == 2 and fields["step_cpu_time_s"]["n"] == 2
    assert fields["train_peak_mem_kind"].startswith("cpu_rss")
    assert fields["step_cuda_time_s"] is None  # nothing on CPU


def test_on_cuda_the_training_peaks_are_taken_from_the_allocator_above_the_baseline(monkeypatch) -> None:
    """A stand-in ``torch.cuda`` (no GPU here): allocated and reserved peaks minus their baselines."""
    import sys

    from repros.runtime.measures.train_peak_reserved import TrainPeakReserved

    state = {"allocated": 100 * MIB, "reserved": 128 * MIB, "max_allocated": 0, "max_reserved": 0}

    def reset_peak_memory_stats(device) -> None:
        state["max_allocated"], state["max_reserved"] = state["allocated"], state["reserved"]

    cuda = SimpleNamespace(
        synchronize=lambda device=None: None,
        memory_allocated=lambda device=None: state["allocated"],
        memory_reserved=lambda device=None: state["reserved"],
        max_memory_allocated=lambda device=None: state["max_allocated"],
        max_memory_reserved=lambda device=None: state["max_reserved"],
        reset_peak_memory_stats=reset_peak_memory_stats,
    )
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=cuda))
    gpu = SimpleNamespace(type="cuda")
    allocated, reserved = TrainPeakMemory(gpu), TrainPeakReserved(gpu)
    state["max_allocated"], state["max_reserved"] = 900 * MIB, 1000 * MIB  # before training: not counted
    allocated.training_begins()
    reserved.training_begins()
    state["max_allocated"], state["max_reserved"] = 300 * MIB, 512 * MIB  # the training's peaks
    assert allocated.result() == {"kind": "cuda_allocated_above_baseline", "value": 200 * MIB, "baseline": 100 * MIB}
    assert reserved.result() == {"kind": "cuda_reserved_above_baseline", "value": 384 * MIB}
    assert TrainPeakReserved(CPU).result() is None  # nothing on CPU
