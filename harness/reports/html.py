"""The static HTML report of a run: ``DIR/index.html``.

One self-contained page (styles, the small script and the SVG plots inline; a
Content-Security-Policy that allows no network at all): the matrix table coloured
by outcome, each entry opening its details, the fixed trainer's and the guards'
costs, and the history of the runs beside this one. Every string from a run goes
through jinja2's autoescaping; only the plots (SVG that matplotlib wrote and
escaped) and the report's own static style and script are inserted as they are.

It stays readable, and small, at 10,000 items: a cell whose every item matched its
expectation (and did not change since the previous run beside it) is folded into one
line, and so are the excluded combinations and the history's unchanged items; each
item's details (and a folded cell's items) are in one JSON block (``report_data``, every
string once), which the page's script turns into markup when they are opened. The
script filters the matrix by repro, cell, family and outcome.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from markupsafe import Markup

from harness import __version__
from harness.core.names import natural_key
from harness.core.text import plain
from harness.records.changes import VERDICTS, Change
from harness.records.item import OWN_WORKAROUND, ItemRecord, counts_text
from harness.records.results import Records, torn_line
from harness.records.run_meta import CellMeta, ExcludedItem, RunMeta
from harness.reports.changes_summary import culprit_text, headline, moved_text
from harness.reports.cost_table import entries as cost_entries
from harness.reports.crosscheck_table import cell_label, crosscheck_records, crosscheck_table, divergence_text
from harness.reports.findings import findings_lines
from harness.reports.finished import FinishedRun
from harness.reports.grid_tables import changes_between_cells as grid_changes
from harness.reports.grid_tables import new_failures as grid_new_failures
from harness.reports.grid_tables import table_data as grid_table
from harness.reports.guard_costs import guard_costs
from harness.reports.history import PastRun, history_items, load_history
from harness.reports.outcome_table import TABLE as OUTCOME_TABLE
from harness.reports.outcome_table import css as outcome_css
from harness.reports.pages import ms, page_environment, static_text
from harness.reports.plots import costs_plot, divergence_plot, fixed_trainer_plot, guard_cost_plot, history_plot
from harness.reports.terminal import figures_text, format_bytes
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
class CellGroup:
    """One cell (a column of the matrix): what its items came to, and whether it is folded."""

    cell: str
    family: str
    items: int
    excluded: int
    #: Every item matched its expectation and none changed since the previous run: one line.
    folded: bool
    #: The previous run's name, where the report knows one (what "unchanged" is measured against).
    since: str | None
    #: Its records' indices in row order (repro, then mode).
    indices: tuple[int, ...]

    @property
    def summary(self) -> str:
        items = f"{self.items} item{'s' if self.items != 1 else ''}"
        matched = "all matched their expectation" if self.items != 1 else "matched its expectation"
        since = f", unchanged since {self.since}" if self.since else ""
        excluded = f" · {self.excluded} excluded" if self.excluded else ""
        return f"{items}, {matched}{since}{excluded}"


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
            shown = f"median {ms(s.median)}, IQR {ms(s.iqr)}, min {ms(s.min)}, max {ms(s.max)} over {s.n} steps"
            rows.append((name, shown, measure.description))
    return rows


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
    # Repros and cells in natural order (F2 before F10, cell9 before cell10), modes as first met;
    # a cell's family variants (``<cell>@<family>``) right after it.
    cells = sorted(dict.fromkeys(k[0] for k in keys), key=cell_order)
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


def cell_order(cell: str) -> tuple[tuple[tuple[int, int | str], ...], bool, tuple[tuple[int, int | str], ...]]:
    """A cell's place: by its name in natural order, a family variant right after its cell."""
    base, _, family = cell.partition("@")
    return natural_key(base), bool(family), natural_key(family)


def changed_items(
    records: Sequence[ItemRecord], history: Sequence[PastRun], changes: Sequence[Change] | None
) -> tuple[set[tuple[str, str, str]], str | None]:
    """The items whose outcome (or signature) differs from the previous run beside this one, or
    that a ``watch`` run's changes name; and the previous run's name (None: none is known)."""
    order = [run.current for run in history]
    previous = history[order.index(True) - 1] if True in order and order.index(True) > 0 else None
    changed = {(c.cell, c.repro, c.mode) for c in changes or []}
    if previous is not None:
        for record in records:
            before = previous.records.get(record.key)
            if before is not None and (before.outcome, before.signature) != (record.outcome, record.signature):
                changed.add(record.key)
    return changed, previous.name if previous is not None else ("the previous night" if changes else None)


def _cell_groups(
    cells: Sequence[str],
    table: Sequence[tuple[str, str, list[Entry]]],
    families: dict[str, str],
    changed: set[tuple[str, str, str]],
    since: str | None,
) -> list[CellGroup]:
    groups = []
    for column, cell in enumerate(cells):
        entries = [row[2][column] for row in table]
        recorded = [e for e in entries if e.record is not None]
        folded = (
            bool(recorded)
            and all(e.kind in ("record", "excluded", "none") for e in entries)
            and all(e.record.matched and e.record.key not in changed for e in recorded if e.record is not None)
        )
        groups.append(
            CellGroup(
                cell=cell,
                family=families.get(cell, ""),
                items=len(recorded),
                excluded=sum(e.kind == "excluded" for e in entries),
                folded=folded,
                since=since,
                indices=tuple(e.index for e in recorded),
            )
        )
    return groups


def _mark(record: ItemRecord) -> int:
    """0: matches its expectation (✓), 1: explored (·), 2: does not (✗)."""
    return 0 if record.matched else 1 if record.is_finding else 2


class _Strings:
    """Every string of the page's data once: the data names them by their index. The script puts
    them on the page as they are, so they are kept as the page shows every run's text: control
    characters and bidirectional overrides made visible (``plain``)."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}

    def __call__(self, text: str) -> int:
        text = plain(text)
        found = self.index.get(text)
        if found is None:
            found = self.index[text] = len(self.index)
        return found


#: How a fact's value is shown: as text, as code, preformatted, or as a command with a copy button.
TEXT, CODE, PRE, COMMAND = 0, 1, 2, 3


def _facts(record: ItemRecord) -> list[tuple[str, str, int]]:
    """An item's details, as (label, value, how it is shown): what its entry opens to."""
    facts: list[tuple[str, str, int]] = [
        ("item", f"{record.cell}/{record.repro}/{record.mode}", TEXT),
        ("outcome", f"{record.outcome} {'✓·✗'[_mark(record)]} {verdict(record)}", TEXT),
    ]
    if record.expected:
        when = ", ".join(f"{k}{v}" for k, v in (record.expected_when or {}).items())
        facts.append(("expected", f"{record.expected} when {when}" if when else str(record.expected), TEXT))
        if record.expected_established_by:
            facts.append(("established by", record.expected_established_by, TEXT))
    if record.signature:
        facts.append(("signature", record.signature, CODE))
    if record.error:
        on_rank = f" on rank {record.error.rank}" if record.error.rank is not None else ""
        facts.append(("error", f"{record.error.type}{on_rank}", CODE))
        facts.append(("message", record.error.message, PRE))
        if record.error.traceback:
            facts.append(("traceback", record.error.traceback, PRE))
    if record.attempts:
        if record.outcome_counts:
            head = f"{record.repeat} (--repeat): {counts_text(record.outcome_counts)}"
        else:
            head = f"{len(record.attempts) + 1} (--reruns), the last one above"
        lines = [
            " ".join(
                filter(
                    None,
                    [
                        str(a.outcome),
                        a.signature or "",
                        f"— {a.error_type}: {(a.message or '')[:200]}" if a.error_type else "",
                        a.item_dir or "",
                    ],
                )
            )
            for a in record.attempts
        ]
        facts.append(("attempts", "\n".join([head, *lines]), PRE))
    for reason in record.reasons:
        facts.append(("reasons", reason, PRE))
    if record.mode == "fixed" or record.guards:
        shown = "; ".join(f"{g.id}: {g.reason}" if g.reason else g.id for g in record.guards)
        facts.append(("guards applied", shown or "none", TEXT))
    for label, figure, note in measured(record):
        facts.append((label, f"{figure} ({note})" if note else figure, TEXT))
    facts.append(("model", record.model, TEXT))
    ran = [f"{record.wall_s or 0:.1f} s; world size {record.world_size}"]
    ran += [f"{record.device}" + (f" ({record.device_name})" if record.device_name else "")] if record.device else []
    ran += [x for x in (record.backend, record.cuda_version and f"CUDA {record.cuda_version}") if x]
    ran += [f"NCCL {record.nccl_version}"] if record.nccl_version else []
    facts.append(("wall", "; ".join(ran), TEXT))
    versions = " · ".join(f"{k} {v}" for k, v in (record.versions or {}).items() if v)
    facts.append(("versions", versions or "none resolved", TEXT))
    differing = record.versions_differing()
    if differing:
        facts.append(("not as listed", "; ".join(differing), TEXT))
    if record.env:
        reused = ", reused" if record.env.reused else ""
        facts.append(("environment", f"{record.env.key} ({record.env.provider}{reused})", CODE))
    facts.append(("rerun", record.repro_cmd, COMMAND))
    if record.item_dir:
        facts.append(("logs", record.item_dir, CODE))
    return facts


def _logs(record: ItemRecord) -> list[tuple[str, str]]:
    """Each rank's log tail (and the launcher's), under its heading."""
    logs = []
    for rank in record.ranks:
        title = f"rank {rank.rank}: {rank.status}"
        title += f" in {rank.phase}" if rank.phase else ""
        title += f", exit code {rank.exitcode}" if rank.exitcode is not None else ""
        title += f", {rank.error_type}" if rank.error_type else ""
        logs.append((title, rank.log_tail or ""))
    if record.launcher_tail:
        logs.append(("launcher", record.launcher_tail))
    return logs


def entry_line(record: ItemRecord) -> str:
    """An entry's figures (and guards) under its outcome."""
    guards = f" · guards: {', '.join(record.guard_ids)}" if record.guards else ""
    return figures_text(record) + guards


def report_data(
    records: Sequence[ItemRecord],
    groups: Sequence[CellGroup],
    excluded: Sequence[ExcludedItem],
    history_runs: Sequence[PastRun],
    history_folded: Sequence[tuple[str, str, str]],
) -> dict[str, object]:
    """What the page's script renders on demand, every string once (``strings``; the rest name
    them by index). ``items``: per record, [cell, repro, mode, outcome, mark, line, why, counts,
    facts (label, value, how shown; flat), logs (title, text; flat)]; ``folded``: each folded
    cell's record indices and its excluded combinations [repro, mode, reason]; ``history``: each
    unchanged item's label and, per run, [outcome, mark, figures] (outcome -1: no record)."""
    s = _Strings()
    items = []
    for record in records:
        facts = [part for label, value, how in _facts(record) for part in (s(label), s(value), how)]
        logs = [s(part) for log in _logs(record) for part in log]
        why = s(verdict(record)) if record.counts_against else -1
        counts = s(f"{counts_text(record.outcome_counts)} of {record.repeat}") if record.outcome_counts else -1
        items.append(
            [
                s(record.cell),
                s(record.repro),
                s(record.mode),
                s(str(record.outcome)),
                _mark(record),
                s(entry_line(record)),
                why,
                counts,
                facts,
                logs,
            ]
        )
    folded: dict[str, object] = {}
    for group in groups:
        if group.folded:
            out = [[s(e.repro), s(e.mode), s(e.reason)] for e in excluded if e.cell == group.cell]
            folded[group.cell] = {"items": list(group.indices), "excluded": out}
    history = []
    for key in history_folded:
        row = []
        for run in history_runs:
            rec = run.records.get(key)
            row.append([-1, 0, -1] if rec is None else [s(str(rec.outcome)), _mark(rec), s(figures_text(rec))])
        history.append([s("/".join(key)), row])
    runs = [s(run.name) for run in history_runs] if history else []
    return {"strings": list(s.index), "items": items, "folded": folded, "history": history, "runs": runs}


def _json_block(data: object) -> Markup:
    """``data`` as JSON that can stand inside a ``<script type="application/json">`` element:
    no ``<``, ``>`` or ``&`` in it (so no ``</script>`` in a string ends the element early)."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return Markup(text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))


def _history_split(runs: Sequence[PastRun]) -> tuple[list[tuple[str, str, str]], list[tuple[str, str, str]]]:
    """The history's items whose outcome moved between the runs (shown), and the rest (folded):
    those with the same outcome in every run that recorded them."""
    moved: list[tuple[str, str, str]] = []
    same: list[tuple[str, str, str]] = []
    for key in history_items(list(runs)):
        seen = {(r.outcome, r.signature) for run in runs if (r := run.records.get(key)) is not None}
        (same if len(seen) <= 1 else moved).append(key)
    return moved, same


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


def _history(
    runs: Sequence[PastRun], keys: Sequence[tuple[str, str, str]]
) -> list[tuple[str, list[ItemRecord | None]]]:
    return [("/".join(key), [run.records.get(key) for run in runs]) for key in keys]


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


def _not_compared(meta: RunMeta) -> int:
    """How many items a ``watch`` run could not pair with the previous night's (``run.json``)."""
    watched = (meta.model_extra or {}).get("watch")
    listed = watched.get("not_compared") if isinstance(watched, dict) else None
    return len(listed) if isinstance(listed, list) else 0


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
    # The fixed trainer's items: a repro's own workaround (a script's fixed command) measures no steps
    # and applies no guard, so neither the trainer's figures nor the guards' cost speak of it.
    trainer = [r for r in records if r.workaround != OWN_WORKAROUND]
    priced, unpriced = guard_costs(trainer)
    costs = cost_entries([records]) if any(r.variant for r in records) else []
    grid_cells, grid_rows = grid_table(records) if any(r.scenario for r in records) else ([], [])
    crosscheck_cells, crosscheck_rows = crosscheck_table(records)
    diverged = [r for r in crosscheck_records(records) if r.outcome == Outcome.DIVERGES]
    crosscheck_plots = [(r, Markup(p) if (p := divergence_plot(r)) else None) for r in diverged[:PLOT_ITEMS]]
    script = static_text("report.js")
    fixed = [r for r in trainer if r.mode == "fixed"]
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
    changed, since = changed_items(records, history, changes)
    groups = _cell_groups(cells, table, cell_families, changed, since)
    shown = [i for i, g in enumerate(groups) if not g.folded]
    # The table holds the cells not folded, and the rows with an item (or a planned one) in them.
    open_table = [
        (repro, mode, [entries[i] for i in shown])
        for repro, mode, entries in table
        if any(entries[i].kind in ("record", "not-run") for i in shown)
    ]
    history_moved, history_same = _history_split(history) if len(history) > 1 else ([], [])
    data = report_data(records, groups, meta.excluded, history, history_same)
    template = page_environment().get_template("report.html.j2")
    return template.generate(
        run=meta,
        record_notes=list(notes),
        run_id=meta.run_id or (records[0].run_id if records else "") or "unknown run",
        records=records,
        cells=[cells[i] for i in shown],
        all_cells=cells,
        cell_families=cell_families,
        families=sorted(set(cell_families.values())),
        table=open_table,
        groups=groups,
        folded=[g for g in groups if g.folded],
        excluded=sorted(meta.excluded, key=lambda e: (cell_order(e.cell), natural_key(e.repro), e.mode)),
        repros=sorted({r.repro for r in records} | {e.repro for e in meta.excluded}, key=natural_key),
        outcomes=[o for o in Outcome if any(r.outcome == o for r in records)],
        entry_line=entry_line,
        data=_json_block(data),
        mismatches=[(i, r) for i, r in enumerate(records) if r.counts_against],
        explored=[(i, r) for i, r in enumerate(records) if r.is_finding and not r.matched],
        findings=findings_lines(records, meta.cells)[1:],
        fixed_trainer_items=len(fixed),
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
        crosscheck_cells=crosscheck_cells,
        crosscheck_rows=crosscheck_rows,
        crosscheck_plots=crosscheck_plots,
        crosscheck_cut=len(diverged) if len(diverged) > PLOT_ITEMS else 0,
        crosscheck_label=cell_label,
        divergence_text=divergence_text,
        history_runs=list(history),
        history_skipped=list(history_skipped),
        history_rows=_history(history, history_moved),
        history_same=len(history_same),
        changes=None if changes is None else sorted(changes, key=lambda c: (VERDICTS.index(c.verdict), c.item)),
        changes_headline=headline(changes or [], _not_compared(meta)),
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
        # The outcomes' colours are the outcome table's (``outcome_table.py``), not written in the style sheet.
        css=Markup(static_text("report.css") + outcome_css()),
        legend=OUTCOME_TABLE,
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
    torn = torn_line(run.records)
    if torn is not None:
        notes = [*notes, f"{torn.describe()}: not counted; `run --resume {run.dir.path}` records it again"]
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
