"""What people read of a crosscheck run: strategies x cells, agree or diverge at a glance, then each
divergence no documented failure explains (a finding), as its smallest strategy with one command that reruns it."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from harness.core.json import JsonValue
from harness.core.text import plain
from harness.records.item import ItemRecord
from harness.reports.outcome_table import terminal_style
from repros.runtime.outcomes import Outcome


def crosscheck_records(records: Sequence[ItemRecord]) -> list[ItemRecord]:
    return [r for r in records if r.kind == "crosscheck"]


def where(record: ItemRecord) -> str:
    """``gradient@1 q_proj.lora_A``: the quantity, the step and the tensor's last parts, where it diverged."""
    d = record.divergence
    if d is None:
        return ""
    at = f"@{d.step}" if d.step is not None else ""
    tensor = ".".join(d.tensor.split(".")[-4:-2]) if d.tensor else ""
    return f"{d.quantity}{at}{f' {tensor}' if tensor else ''}"


def closest_ratio(record: ItemRecord) -> float | None:
    """The largest share of a tolerance any quantity took, over every attempt of the item (``--repeat``)."""
    found: list[object] = [a.closest_ratio for a in record.attempts] or [(record.crosscheck or {}).get("closest_ratio")]
    numbers = [float(v) for v in found if isinstance(v, int | float)]
    return max(numbers) if numbers else None


def _number(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def divergence_text(record: ItemRecord) -> str:
    """``weight of T at step 1: 0.6938 against the reference's 0.6941, relative difference 0.0105 > tolerance
    0.00655``: where and by how much the strategy left the reference (empty where it did not)."""
    d = record.divergence
    if d is None:
        return ""
    text = d.quantity + (f" of {d.tensor}" if d.tensor else "") + (f" at step {d.step}" if d.step is not None else "")
    text += (
        f": {_number(d.value)} against the reference's {_number(d.reference)}"
        if d.reference is not None
        else (f": {_number(d.value)}")
    )
    if d.rel_diff is not None:
        text += f", relative difference {_number(d.rel_diff)} > tolerance {_number(d.tolerance)}"
    return text


def cell_label(record: ItemRecord) -> str:
    if record.outcome == Outcome.AGREES:
        ratio = closest_ratio(record)
        seeds = f" ({record.repeat} seeds)" if record.repeat else ""
        return f"✓ {ratio:.2f}τ{seeds}" if ratio is not None else "✓"
    if record.outcome == Outcome.DIVERGES:
        named = f" {record.signature}" if record.signature else " (undocumented)"
        return f"✗ {where(record)}{named}"
    if record.outcome == Outcome.FLAKY and record.outcome_counts:
        return "FLAKY " + ", ".join(f"{n} {o}" for o, n in sorted(record.outcome_counts.items()))
    return str(record.outcome)


def size(record: ItemRecord) -> tuple[int, int, str]:
    """How small a strategy is: fewer parts beyond the defaults first, one process before many."""
    parts = record.strategy_parts or {}
    beyond = sum(
        1
        for key, default in (
            ("checkpointing", "none"),
            ("accumulation", "none"),
            ("adapter", "lora"),
            ("optimizer", "sgd"),
        )
        if parts.get(key) not in (None, default)
    )
    return beyond + (parts.get("precision") == "bf16"), 0 if parts.get("engine") == "single" else 1, record.mode


def findings(records: Sequence[ItemRecord]) -> list[dict[str, JsonValue]]:
    """Each cell's divergences that count against the run (no documented failure expects them there), as the
    smallest strategy that shows each quantity, with where and how to rerun it."""
    found: dict[tuple[str, str], ItemRecord] = {}
    for record in crosscheck_records(records):
        if record.outcome != Outcome.DIVERGES or not record.counts_against:
            continue
        quantity = record.divergence.quantity if record.divergence else "?"
        key = (record.cell, quantity)
        if key not in found or size(record) < size(found[key]):
            found[key] = record
    return [
        {
            "cell": r.cell,
            "strategy": r.mode,
            "step": r.divergence.step if r.divergence else None,
            "quantity": r.divergence.quantity if r.divergence else None,
            "tensor": r.divergence.tensor if r.divergence else None,
            "value": r.divergence.value if r.divergence else None,
            "reference": r.divergence.reference if r.divergence else None,
            "rel_diff": r.divergence.rel_diff if r.divergence else None,
            "tolerance": r.divergence.tolerance if r.divergence else None,
            "repro_cmd": r.repro_cmd,
        }
        for r in sorted(found.values(), key=lambda r: (r.cell, size(r)))
    ]


def crosscheck_table(records: Sequence[ItemRecord]) -> tuple[list[str], list[tuple[str, dict[str, ItemRecord]]]]:
    """(cells, rows): each strategy (smallest first) with its record per cell."""
    mine = crosscheck_records(records)
    cells = list(dict.fromkeys(r.cell for r in mine))
    first = {r.mode: r for r in reversed(mine)}
    rows: dict[str, dict[str, ItemRecord]] = {name: {} for name in sorted(first, key=lambda name: size(first[name]))}
    for record in mine:
        rows[record.mode][record.cell] = record
    return cells, list(rows.items())


def print_crosscheck(console: Console, records: Sequence[ItemRecord]) -> None:
    mine = crosscheck_records(records)
    if not mine:
        return
    cells, rows = crosscheck_table(records)
    table = Table(
        title="crosscheck: each strategy against one process (✓ agrees, with its closest call as a share of τ)"
    )
    table.add_column("strategy", no_wrap=True)
    for cell in cells:
        table.add_column(cell, overflow="fold")
    for name, entries in rows:
        row: list[Text | str] = [name]
        for cell in cells:
            record = entries.get(cell)
            if record is None:
                row.append(Text("-", style="dim"))
                continue
            # A divergence a documented failure expects there is shown as that failure's.
            documented = record.outcome == Outcome.DIVERGES and not record.counts_against
            row.append(Text(plain(cell_label(record)), style=terminal_style(record.outcome, documented)))
        table.add_row(*row)
    console.print(table)
    agree = sum(r.outcome == Outcome.AGREES for r in mine)
    diverge = sum(r.outcome == Outcome.DIVERGES for r in mine)
    expected = sum(r.outcome == Outcome.DIVERGES and not r.counts_against for r in mine)
    console.print(
        f"{agree} agree, {diverge} diverge ({expected} as a documented failure expects), "
        f"{len(mine) - agree - diverge} could not be compared",
        highlight=False,
    )
    smallest = {(f["cell"], f["strategy"]) for f in findings(records)}
    for record in mine:
        if (record.cell, record.mode) in smallest:
            console.print(
                plain(
                    f"✗ finding in {record.cell}: {record.mode} trains unlike one process: {divergence_text(record)}"
                    f"\n  rerun: {record.repro_cmd}"
                ),
                highlight=False,
                markup=False,
            )
