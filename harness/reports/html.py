"""The static HTML report of a run: ``DIR/index.html``.

One self-contained page (styles, the small script and the SVG plots inline; a
Content-Security-Policy that allows no network at all): the matrix table coloured
by outcome, each entry opening its details, the fixed trainer's and the guards'
costs, and the history of the runs beside this one. Every string from a run goes
through jinja2's autoescaping; only the plots (SVG that matplotlib wrote and
escaped) and the report's own static style and script are inserted as they are.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from harness import __version__
from harness.core.names import natural_key
from harness.records.changes import VERDICTS, Change
from harness.records.item import ItemRecord, counts_text
from harness.records.results import Records
from harness.records.run_meta import CellMeta, ExcludedItem, RunMeta
from harness.reports.changes_summary import culprit_text, headline, moved_text
from harness.reports.cost_table import entries as cost_entries
from harness.reports.finished import FinishedRun
from harness.reports.grid_tables import changes_between_cells as grid_changes
from harness.reports.grid_tables import new_failures as grid_new_failures
from harness.reports.grid_tables import table_data as grid_table
from harness.reports.guard_costs import guard_costs
from harness.reports.history import PastRun, history_items, load_history
from harness.reports.plots import costs_plot, fixed_trainer_plot, guard_cost_plot, history_plot
from harness.reports.terminal import figures_text, format_bytes, format_step
from repros.runtime.measures import Quantity, measures
from repros.runtime.outcomes import Outcome

REPORT_FILE = "index.html"
#: The most items (bars, lines) a plot draws: a plot of thousands is unreadable and takes minutes
#: to draw; the page's tables hold every item, and the page says where a plot shows the first ones.
PLOT_ITEMS = 40


@dataclass(frozen=True)
class Entry:
    """One square of the matrix: a record, an excluded item, a planned item with no record, or nothing."""

    kind: str
    record: ItemRecord | None = None
    index: int = -1
    reason: str = ""

    @property
    def mismatch(self) -> bool:
        return self.record is not None and self.record.counts_against


@dataclass(frozen=True)
class CellRow:
    cell: str
    versions: dict[str, str]
    env: CellMeta | None


def measured(record: ItemRecord) -> list[tuple[str, str, str]]:
    """Each declared measure's figure in an item's details: (label, figure, how it was taken)."""
    rows = []
    for measure in measures():
        figure = record.figure(measure.name)
        name = f"{measure.label} {'memory' if measure.quantity is Quantity.MEMORY else 'time per step'}"
        if figure is None:
            rows.append((name, "-", ""))
        elif measure.quantity is Quantity.MEMORY:
            per_rank = ", ".join(f"{r}: {format_bytes(v)}" for r, v in figure.per_rank.items())
            note = "; ".join(filter(None, [figure.kind, f"per rank: {per_rank}" if per_rank else ""]))
            rows.append((name, format_bytes(int(figure.value or 0)), note))
        elif figure.steps is not None:
            s = figure.steps
            shown = f"median {_ms(s.median)}, IQR {_ms(s.iqr)}, min {_ms(s.min)}, max {_ms(s.max)} over {s.n} steps"
            rows.append((name, shown, measure.description))
    return rows


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f} ms"


def _static(name: str) -> str:
    return resources.files("harness.reports").joinpath("templates", name).read_text(encoding="utf-8")


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("harness.reports", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["bytes"] = format_bytes
    env.filters["step"] = format_step
    env.filters["mib_delta"] = lambda n: "-" if n is None else f"{n / 2**20:+.1f} MiB"
    env.filters["ms_delta"] = lambda s: "-" if s is None else f"{s * 1000:+.1f} ms"
    env.filters["ms"] = _ms
    return env


def verdict(record: ItemRecord) -> str:
    """What the ✓/·/✗ means for this record, in words."""
    if record.matched:
        if record.flaky and record.attempts:
            attempts = record.attempts
            return f"matches its expectation on attempt {len(attempts) + 1} (flaky: {attempts[0].outcome} first)"
        return "matches its expectation"
    if record.is_finding:
        return "explored: what it observed is the finding"
    if record.outcome == Outcome.FLAKY:
        return f"its attempts disagree ({counts_text(record.outcome_counts or {})}), expected {record.expected}"
    if record.outcome == Outcome.UNRESOLVABLE:
        return "no environment"
    if record.expected:
        return f"expected {record.expected}"
    return "no expectation covers these versions"


def _matrix(
    records: Sequence[ItemRecord], excluded: Sequence[ExcludedItem], planned: Sequence[str], finished: bool
) -> tuple[list[str], list[tuple[str, str, list[Entry]]]]:
    keys: list[tuple[str, str, str]] = [r.key for r in records]
    keys += [(e.cell, e.repro, e.mode) for e in excluded]
    # A planned item with no record: the run was interrupted before it (labels are cell/repro/mode).
    seen = set(keys)
    unrun = {(cell, repro, mode): None for cell, repro, mode in (p.split("/", 2) for p in planned if p.count("/") >= 2)}
    keys += [k for k in unrun if k not in seen]
    # Repros in natural order (F2 before F10), modes as first met; a cell's family variants
    # (``<cell>@<family>``) beside it, cells otherwise as first met.
    first_cells = list(dict.fromkeys(k[0].partition("@")[0] for k in keys))
    cells = sorted(dict.fromkeys(k[0] for k in keys), key=lambda c: (first_cells.index(c.partition("@")[0]), c))
    modes = list(dict.fromkeys(k[2] for k in keys))
    rows = sorted(dict.fromkeys((k[1], k[2]) for k in keys), key=lambda row: (natural_key(row[0]), modes.index(row[1])))
    by_key = {r.key: (i, r) for i, r in enumerate(records)}
    excluded_by = {(e.cell, e.repro, e.mode): e for e in excluded}
    table = []
    for repro, mode in rows:
        entries = []
        for cell in cells:
            key = (cell, repro, mode)
            if key in by_key:
                index, record = by_key[key]
                entries.append(Entry("record", record, index))
            elif key in excluded_by:
                entries.append(Entry("excluded", reason=excluded_by[key].reason))
            elif key in unrun:
                why = "planned, but the run ended before it" if finished else "planned, no record yet"
                entries.append(Entry("not-run", reason=why))
            else:
                entries.append(Entry("none"))
        table.append((repro, mode, entries))
    return cells, table


def _cell_versions(records: Sequence[ItemRecord], meta: RunMeta) -> list[CellRow]:
    versions: dict[str, dict[str, str]] = {}
    for rec in records:
        found = versions.setdefault(rec.cell, {})
        if not found:
            found.update({k: v for k, v in rec.versions.items() if v})
    return [CellRow(cell, found, meta.cells.get(cell)) for cell, found in versions.items()]


def _first_items(runs: Sequence[PastRun], keys: Sequence[tuple[str, str, str]]) -> list[PastRun]:
    """The runs with only the records of ``keys`` (what a plot of the first items draws)."""
    wanted = set(keys)
    return [dataclasses.replace(run, records={k: r for k, r in run.records.items() if k in wanted}) for run in runs]


def _history(runs: Sequence[PastRun]) -> list[tuple[str, list[ItemRecord | None]]]:
    return [("/".join(key), [run.records.get(key) for run in runs]) for key in history_items(list(runs))]


def _csp(script: str) -> str:
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    return f"default-src 'none'; style-src 'unsafe-inline'; img-src data:; script-src 'sha256-{digest}'"


def render_report(
    records: Sequence[ItemRecord],
    meta: RunMeta,
    history: Sequence[PastRun] = (),
    history_skipped: Sequence[str] = (),
    changes: Sequence[Change] | None = None,
    changes_problem: str | None = None,
    notes: Sequence[str] = (),
) -> str:
    """The page for ``records`` of the run described by ``meta`` (run.json), with a ``watch``
    run's changes since the previous night where it has them."""
    return "".join(report_parts(records, meta, history, history_skipped, changes, changes_problem, notes=notes))


def report_parts(
    records: Sequence[ItemRecord],
    meta: RunMeta,
    history: Sequence[PastRun] = (),
    history_skipped: Sequence[str] = (),
    changes: Sequence[Change] | None = None,
    changes_problem: str | None = None,
    *,
    notes: Sequence[str] = (),
) -> Iterator[str]:
    """The page of ``render_report``, in the pieces it is rendered in (written as they come).
    ``notes``: what reading the run's results said (an item recorded twice, counted once)."""
    cells, table = _matrix(records, meta.excluded, meta.planned, finished=meta.finished_at is not None)
    priced, unpriced = guard_costs(records)
    costs = cost_entries([records]) if any(r.variant for r in records) else []
    grid_cells, grid_rows = grid_table(records) if any(r.scenario for r in records) else ([], [])
    script = _static("report.js")
    fixed = [r for r in records if r.mode == "fixed"]
    history_keys = history_items(list(history))
    plots = {
        "fixed": fixed_trainer_plot(fixed[:PLOT_ITEMS]),
        "guards": guard_cost_plot(priced[:PLOT_ITEMS]),
        "costs": costs_plot(costs[:PLOT_ITEMS]),
        "history": history_plot(_first_items(history, history_keys[:PLOT_ITEMS])),
    }
    #: Each plot that shows only the first ``PLOT_ITEMS`` items: how many there are.
    plots_cut = {
        name: total
        for name, total in (
            ("fixed", len(fixed)),
            ("guards", len(priced)),
            ("costs", len(costs)),
            ("history", len(history_keys)),
        )
        if total > PLOT_ITEMS
    }
    cell_families = {r.cell: r.family for r in records}
    template = _environment().get_template("report.html.j2")
    return template.generate(
        run=meta,
        record_notes=list(notes),
        run_id=meta.run_id or (records[0].run_id if records else "") or "unknown run",
        records=records,
        cells=cells,
        cell_families=cell_families,
        families=sorted(set(cell_families.values())),
        table=table,
        mismatches=[(i, r) for i, r in enumerate(records) if r.counts_against],
        explored=[(i, r) for i, r in enumerate(records) if r.is_finding and not r.matched],
        matched=sum(1 for r in records if r.matched),
        unrun=sum(1 for _, _, entries in table for e in entries if e.kind == "not-run"),
        cell_versions=_cell_versions(records, meta),
        priced=priced,
        unpriced=unpriced,
        costs=costs,
        grid_cells=grid_cells,
        grid_rows=grid_rows,
        grid_failures=grid_new_failures(records),
        grid_changes=grid_changes(records),
        history_runs=list(history),
        history_skipped=list(history_skipped),
        history_rows=_history(history),
        changes=None if changes is None else sorted(changes, key=lambda c: (VERDICTS.index(c.verdict), c.item)),
        changes_headline=headline(changes or []),
        changes_problem=changes_problem,
        moved_text=moved_text,
        culprit_text=culprit_text,
        plots={k: Markup(v) if v else None for k, v in plots.items()},
        plots_cut=plots_cut,
        plot_items=PLOT_ITEMS,
        verdict=verdict,
        measured=measured,
        counts_text=counts_text,
        figures_text=figures_text,
        css=Markup(_static("report.css")),
        script=Markup(script),
        csp=_csp(script),
        version=__version__,
        generated_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    )


def write(run: FinishedRun) -> Path:
    """Render the run's ``index.html``, with the history beside it (a ``finalize`` report writer).
    The page is written as it is rendered (never whole in memory) and renamed into place whole."""
    skipped: list[str] = []
    history = load_history(run.dir.path, skipped=skipped, current_records=run.records)
    notes = run.records.duplicates if isinstance(run.records, Records) else []
    path = run.dir.path / REPORT_FILE
    tmp = path.with_suffix(".html.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.writelines(
                report_parts(run.records, run.meta, history, skipped, run.changes, run.changes_problem, notes=notes)
            )
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a page cut short never stays beside the whole one
        raise
    return path
