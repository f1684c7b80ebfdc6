"""What every workaround costs, from the records ``costs`` wrote: one entry per repro x variant x
cell, its figures the median over the rounds, priced against the documented scenario in the same
cell where that trains, else against the fixed trainer (which workaround is cheapest).

An entry is what ``costs.json`` holds (``CostEntry``, ``harness/records/costs.py``); it prices three
measures, named here once: the training's peak memory above its baseline, and CPU and wall time per step.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from rich.table import Table
from rich.text import Text

from harness.records.costs import CostEntry, Pricing, Spread
from harness.records.item import ItemRecord
from harness.reports.outcome_table import terminal_style
from harness.reports.terminal import format_bytes
from repros.runtime.outcomes import Outcome
from repros.runtime.spec import AS_DOCUMENTED, FIXED_TRAINER, ReproSpec

#: The measures a workaround is priced by (``repros/runtime/measures``).
MEMORY, CPU_TIME, WALL_TIME = "train_peak_mem", "step_cpu_time", "step_time"


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _spread(values: Sequence[float]) -> float | None:
    if len(values) < 2:
        return None
    mid = statistics.median(values)
    return (max(values) - min(values)) / mid if mid else None


def _values(records: Sequence[ItemRecord], measure: str) -> list[float]:
    return [f.value for f in (r.figure(measure) for r in records) if f is not None and f.value is not None]


def _figures(records: Sequence[ItemRecord]) -> dict[str, object]:
    mems, cpu, wall = _values(records, MEMORY), _values(records, CPU_TIME), _values(records, WALL_TIME)
    cpu_iqr = [f.steps.iqr for f in (r.figure(CPU_TIME) for r in records) if f is not None and f.steps is not None]
    kinds = [f.kind for f in (r.figure(MEMORY) for r in records) if f is not None and f.kind]
    return {
        "train_peak_mem_bytes": _median(mems),
        "train_peak_mem_kind": kinds[0] if kinds else None,
        "step_cpu_time_s": _median(cpu),
        "step_time_s": _median(wall),
        "step_cpu_iqr_s": max(cpu_iqr) if cpu_iqr else None,
        "spread": Spread(train_peak_mem=_spread(mems), step_cpu_time=_spread(cpu), step_time=_spread(wall)),
    }


def _entry(repro: str, variant: str, cell: str, records: Sequence[ItemRecord], spec: ReproSpec | None) -> CostEntry:
    try:
        declared = spec.variant(variant) if spec is not None else None
    except KeyError:
        declared = None
    outcomes = [r.outcome for r in records]
    return CostEntry(
        repro=repro,
        variant=variant,
        cell=cell,
        description=declared.description if declared else "",
        claim=declared.claim if declared else "",
        overrides=dict(declared.overrides) if declared else {},
        outcome=max(set(outcomes), key=outcomes.count),
        outcomes=outcomes,
        signature=next((r.signature for r in records if r.signature), None),
        reasons=next((r.reasons for r in records if r.reasons), []),
        model=records[0].model,
        versions=records[0].versions,
        rounds=len(records),
        **_figures(records),
    )


def entries(rounds: Sequence[Sequence[ItemRecord]], specs: Mapping[str, ReproSpec] | None = None) -> list[CostEntry]:
    """One entry per repro x variant x cell, its figures the median over the rounds, priced
    against the documented scenario in the same cell where that ran clean."""
    by_key: dict[tuple[str, str, str], list[ItemRecord]] = {}
    for records in rounds:
        for record in records:
            if record.variant:
                by_key.setdefault((record.repro, record.variant, record.cell), []).append(record)
    found = [
        _entry(repro, variant, cell, records, (specs or {}).get(repro))
        for (repro, variant, cell), records in by_key.items()
    ]
    priced = _price(found)
    order = {name: i for i, name in enumerate([AS_DOCUMENTED, FIXED_TRAINER])}
    return sorted(priced, key=lambda e: (e.repro, order.get(e.variant, 2), e.variant, e.cell))


def _priced(entry: CostEntry, base: CostEntry) -> Pricing:
    """``entry``'s figures as multiples of ``base``'s, with the noise (twice the larger IQR)."""
    priced: dict[str, float] = {}
    if entry.train_peak_mem_bytes is not None and base.train_peak_mem_bytes is not None:
        priced["train_peak_mem_delta_bytes"] = entry.train_peak_mem_bytes - base.train_peak_mem_bytes
        if base.train_peak_mem_bytes:
            priced["train_peak_mem_ratio"] = entry.train_peak_mem_bytes / base.train_peak_mem_bytes
    if entry.step_cpu_time_s is not None and base.step_cpu_time_s:
        priced["step_cpu_time_s_ratio"] = entry.step_cpu_time_s / base.step_cpu_time_s
    if entry.step_time_s is not None and base.step_time_s:
        priced["step_time_s_ratio"] = entry.step_time_s / base.step_time_s
    if entry.step_cpu_iqr_s is not None and base.step_cpu_iqr_s is not None and base.step_cpu_time_s:
        priced["step_cpu_noise_ratio"] = 2 * max(entry.step_cpu_iqr_s, base.step_cpu_iqr_s) / base.step_cpu_time_s
    return Pricing(**priced)


def _price(found: list[CostEntry]) -> list[CostEntry]:
    """Each variant against the documented scenario in its cell where that trains; and, where it
    does not (the failure is there), against the fixed trainer: which workaround is cheapest."""
    documented = {(e.repro, e.cell): e for e in found if e.variant == AS_DOCUMENTED}
    fixed = {(e.repro, e.cell): e for e in found if e.variant == FIXED_TRAINER}
    priced = []
    for entry in found:
        base = documented.get((entry.repro, entry.cell))
        against_documented = against_fixed = None
        if base is not None and entry is not base:
            if base.outcome == Outcome.PASS:
                against_documented = _priced(entry, base)
            else:
                against_documented = Pricing(why_not=f"the documented scenario ended {base.outcome} in this cell")
                reference = fixed.get((entry.repro, entry.cell))
                if (
                    reference is not None
                    and reference is not entry
                    and reference.outcome == Outcome.PASS
                    and entry.outcome == Outcome.PASS
                ):
                    against_fixed = _priced(entry, reference)
        priced.append(
            entry.model_copy(update={"against_documented": against_documented, "against_fixed_trainer": against_fixed})
        )
    return priced


def _cost_text(entry: CostEntry) -> Text:
    text = Text(entry.outcome + (f" {entry.signature}" if entry.signature else ""), style=terminal_style(entry.outcome))
    mem, cpu = entry.train_peak_mem_bytes, entry.step_cpu_time_s
    text.append(
        f"\n{format_bytes(int(mem)) if mem is not None else '-'} · "
        f"{f'{cpu * 1000:.0f} ms cpu' if cpu is not None else '-'}",
        style="dim",
    )
    priced, against = entry.against_documented, ""
    if (priced is None or priced.train_peak_mem_ratio is None) and entry.against_fixed_trainer is not None:
        priced, against = entry.against_fixed_trainer, "vs fixed trainer: "
    if priced is not None and priced.train_peak_mem_ratio is not None:
        text.append(f"\n{against}mem x{priced.train_peak_mem_ratio:.2f}", style="cyan")
        if priced.step_cpu_time_s_ratio is not None:
            noise = priced.step_cpu_noise_ratio
            text.append(
                f" · cpu x{priced.step_cpu_time_s_ratio:.2f}" + (f" (±{noise:.0%})" if noise else ""), style="cyan"
            )
    if entry.rounds > 1:
        spread = entry.spread.model_dump()
        parts = [f"{k} {v:.1%}" for k, v in spread.items() if v is not None and k != "step_time"]
        if parts:
            text.append("\nrun to run: " + ", ".join(parts), style="dim")
    return text


def costs_table(found: Sequence[CostEntry]) -> Table:
    cells = list(dict.fromkeys(e.cell for e in found))
    rows = list(dict.fromkeys((e.repro, e.variant) for e in found))
    by_key = {(e.repro, e.variant, e.cell): e for e in found}
    table = Table(
        title="what each workaround costs: outcome · training peak memory · CPU time per step · "
        "x the documented configuration where it trains (else x the fixed trainer)",
        show_lines=True,
    )
    table.add_column("repro / variant", style="bold")
    for cell in cells:
        table.add_column(cell)
    for repro, variant in rows:
        row: list[Text | str] = [f"{repro} / {variant}"]
        for cell in cells:
            entry = by_key.get((repro, variant, cell))
            row.append(_cost_text(entry) if entry else Text("-", style="dim"))
        table.add_row(*row)
    return table
