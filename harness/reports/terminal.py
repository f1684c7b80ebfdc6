"""The terminal summary of a run: rows repro x mode, columns cells."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from harness.core.text import plain
from harness.records.item import ItemRecord, StepTime, counts_text
from harness.records.run_meta import ExcludedItem
from harness.reports.figures import headline_measures, memory
from harness.reports.outcome_table import terminal_style
from repros.runtime.measures import Quantity
from repros.runtime.outcomes import Outcome


def format_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit != "GiB" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} GiB"


def format_step(step: StepTime | None) -> str:
    if step is None:
        return "-"
    return f"{step.median * 1000:.0f} ms ±{step.iqr * 1000:.0f}"


def figures_text(rec: ItemRecord) -> str:
    """The headline memory, then every headline step time, each with its measure's label."""
    mem = memory(rec)
    shown = [f"{format_bytes(mem.bytes)} ({mem.what})" if mem else "-"]
    for measure in headline_measures(Quantity.TIME):
        figure = rec.figure(measure.name)
        if figure is not None and figure.steps is not None:
            shown.append(f"{format_step(figure.steps)} {measure.label}")
    return " · ".join(shown)


def entry_text(rec: ItemRecord) -> Text:
    matched = rec.matched
    finding = rec.is_finding and not matched
    # The outcome in its colour (the outcome table's), in bold where it contradicts its expectation;
    # the mark after it says whether it matched.
    style = terminal_style(rec.outcome)
    text = Text(rec.outcome, style=style if matched or finding else f"{style} bold".strip())
    if matched:
        text.append(" ✓", style="green")
        if rec.flaky and rec.attempts:
            text.append(f" flaky ({rec.attempts[0].outcome} first)", style="yellow")
    elif finding:
        text.append(" · explored", style="cyan")
    elif rec.outcome == Outcome.FLAKY:
        text.append(f" ✗ expected {rec.expected}" if rec.expected else " ✗", style="red")
    elif rec.outcome == Outcome.UNRESOLVABLE:
        text.append(" ✗ no environment", style="red")
    elif rec.expected:
        text.append(f" ✗ expected {rec.expected}", style="red")
    else:
        text.append(" ✗ no expectation", style="red")
    if rec.outcome_counts:
        text.append(
            f"\n{counts_text(rec.outcome_counts)} of {rec.repeat}",
            style="yellow" if rec.outcome == Outcome.FLAKY else "dim",
        )
    text.append("\n" + figures_text(rec), style="dim")
    return text


def results_table(records: Sequence[ItemRecord], excluded: Sequence[ExcludedItem] = ()) -> Table:
    cells = list(dict.fromkeys([r.cell for r in records] + [e.cell for e in excluded]))
    rows = list(dict.fromkeys([(r.repro, r.mode) for r in records] + [(e.repro, e.mode) for e in excluded]))
    by_key = {r.key: r for r in records}
    excluded_by_key = {(e.cell, e.repro, e.mode): e for e in excluded}
    table = Table(
        title="outcome (✓ matches expectation, · explored) · peak memory · step time median ±IQR",
        show_lines=True,
    )
    table.add_column("repro / mode", style="bold")
    for cell in cells:
        table.add_column(cell)
    for repro, mode in rows:
        row: list[Text | str] = [f"{repro} / {mode}"]
        for cell in cells:
            rec = by_key.get((cell, repro, mode))
            if rec is not None:
                row.append(entry_text(rec))
            elif (cell, repro, mode) in excluded_by_key:
                row.append(Text(f"excluded\n{excluded_by_key[(cell, repro, mode)].reason}", style="dim"))
            else:
                row.append(Text("-", style="dim"))
        table.add_row(*row)
    return table


def print_summary(console: Console, records: Sequence[ItemRecord], excluded: Sequence[ExcludedItem] = ()) -> None:
    if not records and not excluded:
        console.print("no items ran")
        return
    console.print(results_table(records, excluded))
    cells: dict[str, dict[str, str | None]] = {}
    for rec in records:
        if rec.versions.get("torch"):
            cells.setdefault(rec.cell, rec.versions)
    differing: dict[str, list[str]] = {}
    for rec in records:
        if rec.versions_differing():
            differing.setdefault(rec.cell, rec.versions_differing())
    for cell, versions in cells.items():
        pins = " ".join(f"{k}={v}" for k, v in versions.items() if v)
        line = Text(plain(cell), style="bold")
        line.append(plain(f": {pins}"))
        console.print(line, highlight=False)
        if cell in differing:
            note = Text("  ! ", style="yellow")
            note.append(plain("the ranks imported other versions than the cell lists: " + "; ".join(differing[cell])))
            console.print(note, highlight=False)
    mismatches = [r for r in records if r.counts_against]
    for rec in mismatches:
        if rec.outcome == Outcome.UNRESOLVABLE:
            verdict = "the cell's environment could not be built"
        else:
            verdict = f"expected {rec.expected or 'nothing (no expectation covers these versions)'}"
        line = Text("✗ ", style="red")
        line.append(plain(f"{rec.id.label()}: observed {rec.outcome}, {verdict}"))
        console.print(line, highlight=False)
        if rec.error:
            err = rec.error
            where = f" (rank {err.rank})" if err.rank is not None else ""
            console.print(plain(f"    {err.type}: {err.message}{where}"), highlight=False, markup=False)
        for reason in rec.reasons:
            console.print(plain(f"    {reason.splitlines()[0] if reason else ''}"), highlight=False, markup=False)
        console.print(plain(f"    rerun: {rec.repro_cmd}"), highlight=False, markup=False)
    console.print(counts_line(records), highlight=False)


def counts_line(records: Sequence[ItemRecord]) -> str:
    """How a run's items ended, in one line: how many of those checked against an expectation matched
    it, and how many were explored (what they observed is the finding: no expectation to miss)."""
    explored = sum(1 for r in records if r.is_finding and not r.matched)
    checked = len(records) - explored
    matched = sum(1 for r in records if r.matched)
    flaky = sum(1 for r in records if r.outcome == Outcome.FLAKY)
    said = [f"{matched} of {checked} items matched their expectation"] if checked or not records else []
    if explored:
        items = "items" if explored != 1 else "item"
        said.append(f"{explored} {items} explored (observations, not checked against expectations)")
    if flaky:
        said.append(f"{flaky} flaky (their attempts disagreed)")
    return "; ".join(said)
