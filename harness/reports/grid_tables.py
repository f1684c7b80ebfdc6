"""What people read of a grid run: new failures first, a compatibility table per cell, and what
changed between cells (which combinations a version bump broke or fixed)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table
from rich.text import Text

from harness.core.text import plain
from harness.planning.grid import AS_WRITTEN, GUARDED
from harness.records.item import ItemRecord
from harness.reports.outcome_table import terminal_style
from repros.runtime.outcomes import Outcome
from repros.trainer.grid_axes import AXIS_ORDER

#: What a nightly exists to find.
NEW_FAILURES = (Outcome.NEW_FAILURE, Outcome.SILENT_FAILURE, Outcome.CRASH, Outcome.HANG)


@dataclass(frozen=True)
class Entry:
    outcome: str
    signature: str | None
    guarded: str | None  # the outcome through the guards, where a known failure was run again
    record: ItemRecord

    def label(self) -> str:
        text = self.outcome + (f" {self.signature}" if self.signature else "")
        if self.guarded:
            text += f" → guarded {self.guarded}"
        return text


def grid_records(records: Sequence[ItemRecord]) -> list[ItemRecord]:
    return [r for r in records if r.scenario]


def table_data(records: Sequence[ItemRecord]) -> tuple[list[str], list[tuple[str, str, dict[str, Entry]]]]:
    """(cells, rows): each row a combination (its engine, its id) with an entry per cell."""
    grid = grid_records(records)
    cells = list(dict.fromkeys(r.cell for r in grid))
    guarded = {(r.cell, r.repro): r.outcome for r in grid if r.mode == GUARDED}
    rows: dict[str, tuple[str, dict[str, Entry]]] = {}
    for r in grid:
        if r.mode != AS_WRITTEN:
            continue
        engine = (r.scenario or {}).get("engine", "")
        rows.setdefault(r.repro, (engine, {}))[1][r.cell] = Entry(
            r.outcome, r.signature, guarded.get((r.cell, r.repro)), r
        )
    ordered = sorted(rows.items(), key=lambda kv: (kv[1][0], kv[0]))
    return cells, [(engine, combo, entries) for combo, (engine, entries) in ordered]


def new_failures(records: Sequence[ItemRecord]) -> list[ItemRecord]:
    return [r for r in grid_records(records) if r.outcome in NEW_FAILURES]


def changes_between_cells(records: Sequence[ItemRecord]) -> list[tuple[str, list[tuple[str, str]]]]:
    """Combinations whose outcome is not the same in every cell: (combination, [(cell, label)])."""
    cells, rows = table_data(records)
    found = []
    for _, combo, entries in rows:
        labels = {cell: entries[cell].label() for cell in cells if cell in entries}
        if len({(e.outcome, e.signature) for e in entries.values()}) > 1:
            found.append((combo, list(labels.items())))
    return found


def raised_at(traceback: str) -> str:
    """The innermost frame of a Python traceback, as ``file:line in function``; "" without one."""
    frames = re.findall(r'^\s*File "([^"]+)", line (\d+), in (.+)$', traceback, flags=re.MULTILINE)
    if not frames:
        return ""
    path, line, function = frames[-1]
    return f"{path}:{line} in {function.strip()}"


def print_grid(console: Console, records: Sequence[ItemRecord]) -> None:
    failures = new_failures(records)
    if failures:
        console.print(Text(f"new failures ({len(failures)}): what a nightly exists to find", style="bold red"))
        for r in failures:
            error = r.error
            line = f"  {r.cell} {r.repro} [{r.mode}]: {r.outcome}"
            if error:
                where = f" (rank {error.rank})" if error.rank is not None else ""
                line += f" - {error.type}: {error.message}{where}"
            elif r.reasons:
                line += f" - {r.reasons[0]}"
            console.print(plain(line), highlight=False, markup=False)
            raised = raised_at(error.traceback or "") if error else ""
            if raised:
                console.print(plain(f"    raised at {raised}"), highlight=False, markup=False)
            console.print(plain(f"    rerun: {r.repro_cmd}"), highlight=False, markup=False)
    cells, rows = table_data(records)
    table = Table(
        title="the config grid: each combination as users write it, per cell (→ the same through the guards)",
        show_lines=False,
    )
    table.add_column("engine", style="bold")
    table.add_column("combination (" + " + ".join(a for a in AXIS_ORDER if a != "engine") + ")")
    for cell in cells:
        table.add_column(cell)
    for engine, combo, entries in rows:
        rest = combo.split("+", 1)[1] if "+" in combo else combo
        row: list[Text | str] = [engine, rest]
        for cell in cells:
            entry = entries.get(cell)
            row.append(Text(entry.label(), style=terminal_style(entry.outcome)) if entry else Text("-", style="dim"))
        table.add_row(*row)
    console.print(table)
    changed = changes_between_cells(records)
    if changed:
        console.print(Text("what changed between cells", style="bold"))
        for combo, labels in changed:
            console.print(
                plain(f"  {combo}: " + "; ".join(f"{cell} {label}" for cell, label in labels)),
                highlight=False,
                markup=False,
            )
