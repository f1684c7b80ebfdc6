"""The terminal summary of a run: rows repro x mode, columns cells."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from harness.figures import memory
from harness.records import ItemRecord, counts_against, is_finding
from harness.terminal import plain
from repros.common.outcomes import Outcome

_GOOD = {"PASS", "NOT_REPRODUCED", "REPRODUCED"}


def format_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit != "GiB" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} GiB"


def format_step(step: dict[str, Any] | None) -> str:
    if not step:
        return "-"
    return f"{step['median'] * 1000:.0f} ms ±{step['iqr'] * 1000:.0f}"


def entry_text(rec: ItemRecord) -> Text:
    matched = rec.get("matched")
    finding = is_finding(rec) and not matched
    style = "green" if matched else "cyan" if finding else "bold red"
    text = Text(rec["outcome"], style=style)
    if matched:
        text.append(" ✓", style="green")
        if rec.get("flaky"):
            text.append(f" flaky ({rec['attempts'][0]['outcome']} first)", style="yellow")
    elif finding:
        text.append(" · explored", style="cyan")
    elif rec["outcome"] == Outcome.UNRESOLVABLE:
        text.append(" ✗ no environment", style="red")
    elif rec.get("expected"):
        text.append(f" ✗ expected {rec['expected']}", style="red")
    else:
        text.append(" ✗ no expectation", style="red")
    mem = memory(rec)
    cpu = rec.get("step_cpu_time_s")
    figures = f"\n{format_bytes(mem.bytes if mem else None)}{' (train)' if mem and mem.what == 'training peak' else ''}"
    figures += f" · {format_step(rec.get('step_time_s'))}" + (f" ({format_step(cpu)} cpu)" if cpu else "")
    text.append(figures, style="dim")
    return text


def results_table(records: Sequence[ItemRecord], excluded: Sequence[dict[str, Any]] = ()) -> Table:
    cells = list(dict.fromkeys([r["cell"] for r in records] + [e["cell"] for e in excluded]))
    rows = list(dict.fromkeys([(r["repro"], r["mode"]) for r in records] + [(e["repro"], e["mode"]) for e in excluded]))
    by_key = {(r["cell"], r["repro"], r["mode"]): r for r in records}
    excluded_by_key = {(e["cell"], e["repro"], e["mode"]): e for e in excluded}
    table = Table(
        title="outcome (✓ matches expectation, · explored) · training peak memory · step time median ±IQR (CPU time)",
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
                row.append(Text(f"excluded\n{excluded_by_key[(cell, repro, mode)]['reason']}", style="dim"))
            else:
                row.append(Text("-", style="dim"))
        table.add_row(*row)
    return table


def print_summary(console: Console, records: Sequence[ItemRecord], excluded: Sequence[dict[str, Any]] = ()) -> None:
    if not records and not excluded:
        console.print("no items ran")
        return
    console.print(results_table(records, excluded))
    cells: dict[str, dict[str, Any]] = {}
    for rec in records:
        if rec.get("versions", {}).get("torch"):
            cells.setdefault(rec["cell"], rec["versions"])
    for cell, versions in cells.items():
        pins = " ".join(f"{k}={v}" for k, v in versions.items() if v)
        line = Text(plain(cell), style="bold")
        line.append(plain(f": {pins}"))
        console.print(line, highlight=False)
    mismatches = [r for r in records if counts_against(r)]
    for rec in mismatches:
        if rec["outcome"] == Outcome.UNRESOLVABLE:
            verdict = "the cell's environment could not be built"
        else:
            verdict = f"expected {rec.get('expected') or 'nothing (no expectation covers these versions)'}"
        line = Text("✗ ", style="red")
        line.append(plain(f"{rec['cell']}/{rec['repro']}/{rec['mode']}: observed {rec['outcome']}, {verdict}"))
        console.print(line, highlight=False)
        if rec.get("error"):
            err = rec["error"]
            where = f" (rank {err['rank']})" if err.get("rank") is not None else ""
            console.print(plain(f"    {err.get('type')}: {err.get('message')}{where}"), highlight=False, markup=False)
        for reason in rec.get("reasons") or []:
            console.print(plain(f"    {reason.splitlines()[0] if reason else ''}"), highlight=False, markup=False)
        console.print(plain(f"    rerun: {rec.get('repro_cmd')}"), highlight=False, markup=False)
    matched = sum(1 for r in records if r.get("matched"))
    explored = sum(1 for r in records if is_finding(r) and not r.get("matched"))
    line = f"{matched} of {len(records)} items matched their expectation"
    console.print(line + (f"; {explored} explored" if explored else ""), highlight=False)
