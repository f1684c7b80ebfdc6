"""What the fixed trainer's guards cost, per cell and repro.

Where ``bug`` mode ran clean (NOT_REPRODUCED), its record is the same scenario without the
guards (but those of the CPU machine's hazards, which both modes have), so ``fixed`` minus
``bug`` prices the guards the fixed trainer applied there and ``bug`` did not. Where ``bug``
failed there is no unguarded baseline to price them against. A difference with no guards
applied is run-to-run noise, and a step-time difference within twice the larger interquartile
range is within the noise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.records.item import ItemRecord
from harness.reports.figures import comparable_memory, comparable_steps, memory, steps

NOISE_FACTOR = 2.0


@dataclass(frozen=True)
class GuardCost:
    cell: str
    repro: str
    guards: tuple[str, ...]
    fixed_outcome: str
    mem_kind: str | None
    bug_mem: int | None
    fixed_mem: int | None
    bug_step_s: float | None
    fixed_step_s: float | None
    #: Twice the larger IQR of the two step times: a smaller change is noise.
    step_noise_s: float | None
    note: str
    #: Which step time: "CPU" (process CPU time per step) or "wall".
    step_what: str | None = None

    @property
    def label(self) -> str:
        return f"{self.cell}/{self.repro}"

    @property
    def mem_delta(self) -> int | None:
        if self.bug_mem is None or self.fixed_mem is None:
            return None
        return self.fixed_mem - self.bug_mem

    @property
    def step_delta_s(self) -> float | None:
        if self.bug_step_s is None or self.fixed_step_s is None:
            return None
        return self.fixed_step_s - self.bug_step_s


@dataclass(frozen=True)
class Unpriced:
    """A fixed-mode item whose guards could not be priced, and why."""

    cell: str
    repro: str
    guards: tuple[str, ...]
    why: str


def _median(record: ItemRecord) -> float | None:
    found = steps(record)
    return found.summary.median if found else None


def _note(guards: tuple[str, ...], step_delta: float | None, noise: float | None) -> str:
    if not guards:
        return "no guards applied: the difference is run-to-run noise"
    if step_delta is not None and noise is not None and abs(step_delta) <= noise:
        return f"step time within the noise (±{noise * 1000:.0f} ms)"
    return ""


def _cost(bug: ItemRecord, fixed: ItemRecord) -> GuardCost:
    # The guards the bug run had too (a CPU hazard's, guarded in every mode) cost both the same.
    guards = tuple(g for g in fixed.guard_ids if g not in bug.guard_ids)
    memory = comparable_memory(bug, fixed)
    timed = comparable_steps(bug, fixed)
    bug_step = fixed_step = noise = delta = None
    if timed is not None:
        bug_step, fixed_step = timed[0].summary.median, timed[1].summary.median
        noise = NOISE_FACTOR * max(timed[0].summary.iqr, timed[1].summary.iqr)
        delta = fixed_step - bug_step
    note = _note(guards, delta, noise)
    if memory is None:
        note = "; ".join(filter(None, [note, "memory measured differently in the two modes: not compared"]))
    return GuardCost(
        cell=fixed.cell,
        repro=fixed.repro,
        guards=guards,
        fixed_outcome=fixed.outcome,
        mem_kind=memory[1].kind if memory else None,
        bug_mem=memory[0].bytes if memory else None,
        fixed_mem=memory[1].bytes if memory else None,
        bug_step_s=bug_step,
        fixed_step_s=fixed_step,
        step_noise_s=noise,
        note=note,
        step_what=timed[0].what if timed else None,
    )


def guard_costs(records: Sequence[ItemRecord]) -> tuple[list[GuardCost], list[Unpriced]]:
    """The priced guards (one per cell x repro with both modes measured) and the rest."""
    by_key = {r.key: r for r in records}
    priced: list[GuardCost] = []
    unpriced: list[Unpriced] = []
    for (cell, repro, mode), fixed in by_key.items():
        if mode != "fixed":
            continue
        bug = by_key.get((cell, repro, "bug"))
        guards = fixed.guard_ids
        if bug is None:
            why = "bug mode did not run in this cell"
        elif bug.outcome != "NOT_REPRODUCED":
            why = f"bug mode ended {bug.outcome}: no clean unguarded run to price the guards against"
        elif memory(fixed) is None and _median(fixed) is None:
            why = f"fixed mode ended {fixed.outcome} without measurements"
        elif memory(bug) is None and _median(bug) is None:
            why = "bug mode recorded no measurements"
        else:
            priced.append(_cost(bug, fixed))
            continue
        unpriced.append(Unpriced(cell, repro, guards, why))
    return priced, unpriced
