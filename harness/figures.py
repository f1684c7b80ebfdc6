"""Which of a record's figures to show and compare, and what they are.

Memory: the training's own peak above its baseline (``train_peak_mem_bytes``) where the record
has it; older records, and items that never reached a first step, only have the process's
whole-life peak (``peak_mem_bytes``, the imported libraries included). Step time: process CPU
time per step (``step_cpu_time_s``), which a busy machine does not inflate, where measured;
else wall time per step (``step_time_s``).
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.records import ItemRecord, StepTime


@dataclass(frozen=True)
class Memory:
    bytes: int
    kind: str
    #: "training peak" or "process peak".
    what: str


@dataclass(frozen=True)
class Steps:
    summary: StepTime
    #: "CPU" or "wall".
    what: str


def memory(record: ItemRecord) -> Memory | None:
    if record.get("train_peak_mem_bytes") is not None:
        return Memory(int(record["train_peak_mem_bytes"]), str(record.get("train_peak_mem_kind")), "training peak")
    if record.get("peak_mem_bytes") is not None:
        return Memory(int(record["peak_mem_bytes"]), str(record.get("peak_mem_kind")), "process peak")
    return None


def steps(record: ItemRecord, prefer_cpu: bool = True) -> Steps | None:
    fields = (("step_cpu_time_s", "CPU"), ("step_time_s", "wall")) if prefer_cpu else (("step_time_s", "wall"),)
    for field, what in fields:
        summary = record.get(field)  # type: ignore[misc]
        if summary:
            return Steps(summary, what)
    return None


def comparable_memory(old: ItemRecord, new: ItemRecord) -> tuple[Memory, Memory] | None:
    """Two records' memory figures where they were taken the same way (else None)."""
    a, b = memory(old), memory(new)
    if a is None or b is None or (a.what, a.kind) != (b.what, b.kind):
        # Fall back to the process peak of both, where each has one.
        if old.get("peak_mem_bytes") is None or new.get("peak_mem_bytes") is None:
            return None
        a = Memory(int(old["peak_mem_bytes"]), str(old.get("peak_mem_kind")), "process peak")
        b = Memory(int(new["peak_mem_bytes"]), str(new.get("peak_mem_kind")), "process peak")
        if a.kind != b.kind:
            return None
    if a.what == "process peak" and a.kind == "cpu_peak_rss":
        # A CPU peak RSS is comparable only between the same launchers: a rank forked from a
        # cell's worker never touches the pages of the imports it does not use (~60 MiB less).
        if old.get("launcher", "torchrun") != new.get("launcher", "torchrun"):
            return None
    return a, b


def comparable_steps(old: ItemRecord, new: ItemRecord) -> tuple[Steps, Steps] | None:
    for prefer_cpu in (True, False):
        a, b = steps(old, prefer_cpu), steps(new, prefer_cpu)
        if a is not None and b is not None and a.what == b.what:
            return a, b
    return None
