"""The report's plots, drawn by matplotlib (no display, no pyplot) as SVG text to inline.

Text reaches the SVG only through matplotlib, which escapes it; fonts are left to
the browser (``svg.fonttype: none``), so the page needs nothing from the network.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from harness.records.item import ItemRecord
from harness.reports.cost_table import CostEntry
from harness.reports.figures import memory, steps
from harness.reports.guard_costs import GuardCost
from harness.reports.history import PastRun, history_items

if TYPE_CHECKING:
    from matplotlib.figure import Figure

MIB = 2**20
#: matplotlib types its settings by name; these are passed to it as they are.
STYLE: dict[Any, Any] = {"svg.fonttype": "none", "font.size": 9, "axes.spines.top": False, "axes.spines.right": False}


def figure(width: float, height: float, columns: int = 2) -> tuple[Figure, Any]:
    # A bare Figure (no pyplot) draws with no GUI backend and no global state.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.subplots(1, columns, squeeze=False)[0]


def legend_height(entries: int, columns: int) -> float:
    """The height (inches) a legend of ``entries`` names in ``columns`` takes under the plots."""
    return 0.16 * -(-entries // columns)


def legend_below(fig: Figure, ax: Any, columns: int, fontsize: int) -> None:
    """``ax``'s legend under every plot of ``fig``, the figure grown by ``legend_height`` for it: beside or inside
    the plots, forty names would leave them no room (matplotlib warns and draws empty axes)."""
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncols=columns, fontsize=fontsize)


def svg_text(fig: Figure) -> str:
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context(STYLE):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue()
    # The XML declaration and DOCTYPE belong to a file, not to an element in a page.
    return text[text.index("<svg") :]


def _kind_label(kinds: set[str | None]) -> str:
    known = sorted(k for k in kinds if k)
    return ", ".join(known) if known else "unknown"


def _width(n: int) -> float:
    return min(16.0, max(10.0, 3.0 + 1.2 * n))


def fixed_trainer_plot(records: Sequence[ItemRecord]) -> str | None:
    """Peak memory and step time (median, IQR bar) of the fixed trainer per cell, one bar per repro."""
    fixed = [r for r in records if r.mode == "fixed" and (memory(r) is not None or steps(r) is not None)]
    if not fixed:
        return None
    import matplotlib

    with matplotlib.rc_context(STYLE):
        cells = list(dict.fromkeys(r.cell for r in fixed))
        repros = list(dict.fromkeys(r.repro for r in fixed))
        legend_columns = 6
        legend = legend_height(len(repros), legend_columns) if len(repros) > 1 else 0.0
        fig, (mem_ax, time_ax) = figure(_width(len(cells) * len(repros)), 3.4 + legend)
        width = 0.8 / len(repros)
        for j, repro in enumerate(repros):
            xs: list[float] = []
            mems: list[float] = []
            times: list[float] = []
            errs: list[float] = []
            for i, cell in enumerate(cells):
                rec = next((r for r in fixed if r.cell == cell and r.repro == repro), None)
                if rec is None:
                    continue
                xs.append(i + (j - (len(repros) - 1) / 2) * width)
                mem = memory(rec)
                mems.append((mem.bytes if mem else 0) / MIB)
                found = steps(rec)
                times.append(found.summary.median * 1000 if found else 0.0)
                errs.append(found.summary.iqr * 1000 / 2 if found else 0.0)
            mem_ax.bar(xs, mems, width, label=repro)
            time_ax.bar(xs, times, width, yerr=errs, capsize=3, label=repro)
        mems_taken = [m for m in (memory(r) for r in fixed) if m]
        kinds = _kind_label({m.kind for m in mems_taken})
        what = _kind_label({m.what for m in mems_taken})
        mem_ax.set_title(f"fixed trainer: {what} memory ({kinds})")
        mem_ax.set_ylabel("MiB (max over ranks)")
        step_what = _kind_label({s.what for s in (steps(r) for r in fixed) if s})
        time_ax.set_title(f"fixed trainer: {step_what} time per step (median; whisker: IQR)")
        time_ax.set_ylabel("ms")
        for ax in (mem_ax, time_ax):
            ax.set_xticks(range(len(cells)), cells, rotation=20, ha="right")
        if len(repros) > 1:
            legend_below(fig, mem_ax, legend_columns, fontsize=8)
        return svg_text(fig)


def guard_cost_plot(costs: Sequence[GuardCost]) -> str | None:
    """Fixed minus bug per cell x repro: the guards' memory and step-time cost (hatched: no guards)."""
    if not costs:
        return None
    import matplotlib

    with matplotlib.rc_context(STYLE):
        fig, (mem_ax, time_ax) = figure(_width(len(costs)), 3.6)
        labels = [f"{c.label}\n{'+'.join(c.guards) or 'no guards'}" for c in costs]
        xs = list(range(len(costs)))
        colours = ["#b35806" if c.guards else "#bbbbbb" for c in costs]
        hatches = ["" if c.guards else "//" for c in costs]
        mem = [(c.mem_delta or 0) / MIB for c in costs]
        time = [(c.step_delta_s or 0.0) * 1000 for c in costs]
        noise = [(c.step_noise_s or 0.0) * 1000 for c in costs]
        for ax, values in ((mem_ax, mem), (time_ax, time)):
            bars = ax.bar(xs, values, 0.6, color=colours)
            for bar, hatch in zip(bars, hatches, strict=True):
                bar.set_hatch(hatch)
            ax.axhline(0, color="black", linewidth=0.8)
            ax.set_xticks(xs, labels, rotation=20, ha="right")
        time_ax.errorbar(xs, [0.0] * len(xs), yerr=noise, fmt="none", ecolor="#555555", capsize=4, label="noise")
        mem_ax.set_title("guards' cost: Δ peak memory (fixed − bug)")
        mem_ax.set_ylabel("MiB")
        time_ax.set_title("guards' cost: Δ step time (whisker: noise)")
        time_ax.set_ylabel("ms")
        return svg_text(fig)


def costs_plot(found: Sequence[CostEntry]) -> str | None:
    """Each workaround's training peak memory and CPU time per step, per cell (``costs``)."""
    measured = [e for e in found if e.train_peak_mem_bytes is not None or e.step_cpu_time_s is not None]
    if not measured:
        return None
    import matplotlib

    with matplotlib.rc_context(STYLE):
        rows = list(dict.fromkeys((e.repro, e.variant) for e in measured))
        cells = list(dict.fromkeys(e.cell for e in measured))
        fig, (mem_ax, time_ax) = figure(_width(len(rows) * max(1, len(cells)) // 2 + 2), 3.8)
        width = 0.8 / len(cells)
        for j, cell in enumerate(cells):
            xs: list[float] = []
            mems: list[float] = []
            times: list[float] = []
            for i, row in enumerate(rows):
                entry = next((e for e in measured if (e.repro, e.variant) == row and e.cell == cell), None)
                if entry is None:
                    continue
                xs.append(i + (j - (len(cells) - 1) / 2) * width)
                mems.append((entry.train_peak_mem_bytes or 0) / MIB)
                times.append((entry.step_cpu_time_s or 0.0) * 1000)
            mem_ax.bar(xs, mems, width, label=cell)
            time_ax.bar(xs, times, width, label=cell)
        labels = [f"{r} {v}" for r, v in rows]
        mem_ax.set_title("workarounds: the training's peak memory above its baseline")
        mem_ax.set_ylabel("MiB (max over ranks)")
        time_ax.set_title("workarounds: process CPU time per step")
        time_ax.set_ylabel("ms (the busiest rank)")
        for ax in (mem_ax, time_ax):
            ax.set_xticks(range(len(rows)), labels, rotation=30, ha="right")
            if len(cells) > 1:
                ax.legend(fontsize=8)
        return svg_text(fig)


def history_plot(runs: Sequence[PastRun]) -> str | None:
    """Each item's step time and peak memory across the runs (oldest left)."""
    if len(runs) < 2:
        return None
    items = [key for key in history_items(list(runs)) if any(_measured(r.records.get(key)) for r in runs)]
    if not items:
        return None
    import matplotlib

    legend_columns = 3
    with matplotlib.rc_context(STYLE):
        fig, (time_ax, mem_ax) = figure(_width(len(runs)), 3.8 + legend_height(len(items), legend_columns))
        xs = list(range(len(runs)))
        for key in items:
            label = "/".join(key)
            times = [_step_ms(r.records.get(key)) for r in runs]
            mems = [_mib(r.records.get(key)) for r in runs]
            time_ax.plot(xs, times, marker="o", markersize=3, label=label)
            mem_ax.plot(xs, mems, marker="o", markersize=3, label=label)
        names = [f"{r.name}{' (this)' if r.current else ''}" for r in runs]
        for ax in (time_ax, mem_ax):
            ax.set_xticks(xs, names, rotation=25, ha="right", fontsize=7)
        time_ax.set_title("step time median per item")
        time_ax.set_ylabel("ms")
        mem_ax.set_title("peak memory per item")
        mem_ax.set_ylabel("MiB")
        legend_below(fig, mem_ax, legend_columns, fontsize=7)
        return svg_text(fig)


def _measured(record: ItemRecord | None) -> bool:
    return record is not None and (steps(record) is not None or memory(record) is not None)


def _step_ms(record: ItemRecord | None) -> float:
    found = steps(record) if record is not None else None
    return found.summary.median * 1000 if found else float("nan")


def _mib(record: ItemRecord | None) -> float:
    found = memory(record) if record is not None else None
    return found.bytes / MIB if found else float("nan")


def _series(values: object) -> list[float]:
    """A trajectory's values as numbers (a non-finite one, written by name, as NaN: a gap in the line)."""
    if not isinstance(values, list):
        return []
    return [float(v) if isinstance(v, int | float) else float("nan") for v in values]


def divergence_plot(record: ItemRecord) -> str | None:
    """A crosscheck strategy's loss and gradient norm per step against the one-process reference's, the step
    where it diverged marked (None where the record holds no trajectories)."""
    facts = record.crosscheck or {}
    strategy, reference = facts.get("trajectory"), facts.get("reference_trajectory")
    if not isinstance(strategy, dict) or not isinstance(reference, dict):
        return None
    fig, axes = figure(8.0, 2.4)
    step = record.divergence.step if record.divergence else None
    for ax, key, title in zip(axes, ("loss", "grad_norm"), ("loss", "gradient norm"), strict=True):
        ours, theirs = _series(strategy.get(key)), _series(reference.get(key))
        if theirs:
            ax.plot(range(len(theirs)), theirs, "--", color="#57606a", label="one process (reference)")
        if ours:
            ax.plot(range(len(ours)), ours, "-o", color="#cf222e", markersize=3, label=record.strategy or "strategy")
        if isinstance(step, int):
            ax.axvline(step, color="#cf222e", alpha=0.25, linewidth=6)
        ax.set_title(title)
        ax.set_xlabel("step")
    axes[0].legend(loc="best", fontsize=7)
    return svg_text(fig)
