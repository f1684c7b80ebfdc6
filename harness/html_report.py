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
import datetime as dt
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from harness import __version__
from harness.costs import entries as cost_entries
from harness.grid_report import changes_between_cells as grid_changes
from harness.grid_report import new_failures as grid_new_failures
from harness.grid_report import table_data as grid_table
from harness.guard_cost import guard_costs
from harness.history import PastRun, history_items, load_history
from harness.plots import costs_plot, fixed_trainer_plot, guard_cost_plot, history_plot
from harness.records import ItemRecord, counts_against, is_finding
from harness.summary import format_bytes, format_step
from repros.common.outcomes import Outcome

if TYPE_CHECKING:
    from harness.finalize import FinishedRun

REPORT_FILE = "index.html"


@dataclass(frozen=True)
class Entry:
    """One square of the matrix: a record, an excluded item, a planned item with no record, or nothing."""

    kind: str
    record: ItemRecord | None = None
    index: int = -1
    reason: str = ""

    @property
    def mismatch(self) -> bool:
        return self.record is not None and counts_against(self.record)


#: Fields the page reads from every record; a record from an older schema gets them empty.
_RECORD_DEFAULTS: dict[str, Any] = {
    "outcome": "?",
    "signature": None,
    "expected": None,
    "matched": False,
    "versions": {},
    "world_size": None,
    "device": None,
    "peak_mem_bytes": None,
    "peak_mem_kind": None,
    "step_time_s": None,
    "train_peak_mem_bytes": None,
    "train_peak_mem_kind": None,
    "step_cpu_time_s": None,
    "model": "tiny",
    "wall_s": 0.0,
    "error": None,
    "reasons": [],
    "guards": [],
    "repro_cmd": "",
}


def normalised(record: ItemRecord) -> dict[str, Any]:
    return {**_RECORD_DEFAULTS, **{k: v for k, v in record.items() if v is not None or k not in _RECORD_DEFAULTS}}


def _static(name: str) -> str:
    return resources.files("harness").joinpath("templates", name).read_text(encoding="utf-8")


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("harness", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["bytes"] = format_bytes
    env.filters["step"] = format_step
    env.filters["mib_delta"] = lambda n: "-" if n is None else f"{n / 2**20:+.1f} MiB"
    env.filters["ms_delta"] = lambda s: "-" if s is None else f"{s * 1000:+.1f} ms"
    env.filters["ms"] = lambda s: "-" if s is None else f"{s * 1000:.1f} ms"
    return env


def verdict(record: ItemRecord) -> str:
    """What the ✓/·/✗ means for this record, in words."""
    if record.get("matched"):
        if record.get("flaky"):
            attempts = record["attempts"]
            return f"matches its expectation on attempt {len(attempts) + 1} (flaky: {attempts[0]['outcome']} first)"
        return "matches its expectation"
    if is_finding(record):
        return "explored: what it observed is the finding"
    if record.get("outcome") == Outcome.UNRESOLVABLE:
        return "no environment"
    if record.get("expected"):
        return f"expected {record['expected']}"
    return "no expectation covers these versions"


def _matrix(
    records: Sequence[ItemRecord], excluded: Sequence[dict[str, Any]], planned: Sequence[str], finished: bool
) -> tuple[list[str], list[tuple[str, str, list[Entry]]]]:
    keys: list[tuple[str, str, str]] = [(r["cell"], r["repro"], r["mode"]) for r in records]
    keys += [(e["cell"], e["repro"], e["mode"]) for e in excluded]
    # A planned item with no record: the run was interrupted before it (labels are cell/repro/mode).
    unrun = [(cell, repro, mode) for cell, repro, mode in (p.split("/", 2) for p in planned if p.count("/") >= 2)]
    keys += [k for k in unrun if k not in set(keys)]
    cells = list(dict.fromkeys(k[0] for k in keys))
    rows = list(dict.fromkeys((k[1], k[2]) for k in keys))
    by_key = {(r["cell"], r["repro"], r["mode"]): (i, r) for i, r in enumerate(records)}
    excluded_by = {(e["cell"], e["repro"], e["mode"]): e for e in excluded}
    table = []
    for repro, mode in rows:
        entries = []
        for cell in cells:
            key = (cell, repro, mode)
            if key in by_key:
                index, record = by_key[key]
                entries.append(Entry("record", record, index))
            elif key in excluded_by:
                entries.append(Entry("excluded", reason=str(excluded_by[key].get("reason") or "")))
            elif key in unrun:
                why = "planned, but the run ended before it" if finished else "planned, no record yet"
                entries.append(Entry("not-run", reason=why))
            else:
                entries.append(Entry("none"))
        table.append((repro, mode, entries))
    return cells, table


def _cell_versions(records: Sequence[ItemRecord], meta: dict[str, Any]) -> list[dict[str, Any]]:
    cells: dict[str, dict[str, Any]] = {}
    for rec in records:
        env = (meta.get("cells") or {}).get(rec["cell"]) or {}
        info = cells.setdefault(rec["cell"], {"cell": rec["cell"], "versions": {}, "env": env})
        if not info["versions"] and any((rec.get("versions") or {}).values()):
            info["versions"] = {k: v for k, v in rec["versions"].items() if v}
    return list(cells.values())


def _history(runs: Sequence[PastRun]) -> list[tuple[str, list[dict[str, Any] | None]]]:
    rows = []
    for key in history_items(list(runs)):
        found = [run.records.get(key) for run in runs]
        rows.append(("/".join(key), [normalised(r) if r is not None else None for r in found]))
    return rows


def _csp(script: str) -> str:
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    return f"default-src 'none'; style-src 'unsafe-inline'; img-src data:; script-src 'sha256-{digest}'"


def render_report(
    records: Sequence[ItemRecord],
    meta: dict[str, Any],
    history: Sequence[PastRun] = (),
    history_skipped: Sequence[str] = (),
) -> str:
    """The page for ``records`` of the run described by ``meta`` (run.json)."""
    records = [normalised(r) for r in records]
    excluded = list(meta.get("excluded") or [])
    planned = [p for p in meta.get("planned") or [] if isinstance(p, str)]
    cells, table = _matrix(records, excluded, planned, finished=bool(meta.get("finished_at")))
    priced, unpriced = guard_costs(records)
    costs = cost_entries([records]) if any(r.get("variant") for r in records) else []
    grid_cells, grid_rows = grid_table(records) if any(r.get("scenario") for r in records) else ([], [])
    script = _static("report.js")
    plots = {
        "fixed": fixed_trainer_plot(records),
        "guards": guard_cost_plot(priced),
        "costs": costs_plot(costs),
        "history": history_plot(history),
    }
    template = _environment().get_template("report.html.j2")
    return template.render(
        run=meta,
        run_id=str(meta.get("run_id") or (records[0].get("run_id") if records else "") or "unknown run"),
        records=records,
        cells=cells,
        table=table,
        mismatches=[(i, r) for i, r in enumerate(records) if counts_against(r)],
        explored=[(i, r) for i, r in enumerate(records) if is_finding(r) and not r.get("matched")],
        matched=sum(1 for r in records if r.get("matched")),
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
        plots={k: Markup(v) if v else None for k, v in plots.items()},
        verdict=verdict,
        is_finding=is_finding,
        css=Markup(_static("report.css")),
        script=Markup(script),
        csp=_csp(script),
        version=__version__,
        generated_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    )


def write(run: FinishedRun) -> Path:
    """Render the run's ``index.html``, with the history beside it (a ``finalize`` report writer)."""
    skipped: list[str] = []
    history = load_history(run.dir.path, skipped=skipped)
    page = render_report(run.records, run.meta, history, skipped)
    path = run.dir.path / REPORT_FILE
    tmp = path.with_suffix(".html.tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(path)
    return path
