"""The runs beside a run: every sibling directory holding ``run.json`` and
``results.jsonl``, oldest first, for the report's trend of each item.

Other runs' files are read defensively: each record is validated, and one that is not a record
of this harness (a field of the wrong type, an outcome that does not exist) is left out and
named, never trusted, so one damaged run never stops a later run's report; a run whose
``run.json`` cannot be read, or whose results hold more than ``MOST_LINES_LEFT_OUT`` lines that are
not records (a corrupt or foreign file), is left out whole, read no further. Either way a run is
named in one line, however much of it is bad: a sibling full of garbage neither floods the log nor
swells the report."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.core.errors import UserError
from harness.records.item import ItemRecord
from harness.records.results import RESULTS_FILE, Records, read_results
from harness.records.run_dir import RUN_FILE, RunDir

#: The most runs the history shows (the newest ones, the current run always among them).
DEFAULT_LIMIT = 30

Key = tuple[str, str, str]


@dataclass(frozen=True)
class PastRun:
    run_id: str
    name: str
    started_at: str
    records: dict[Key, ItemRecord]
    current: bool


def _load(
    directory: Path, current: bool, skipped: list[str], known: Sequence[ItemRecord] | None = None
) -> tuple[PastRun | None, str]:
    """A sibling run, or None and why it cannot be read (it is left out of the history, not fatal);
    each of its lines that is not a record is left out and said in ``skipped``. ``known``: its
    records, where the caller has read them already (the current run's)."""
    run = RunDir(directory)
    try:
        if known is not None:
            records = Records(known)
        elif run.results_path.is_file():
            records = read_results(run.results_path, lenient=True)
        else:
            records = Records()
        meta = run.read_meta()
    except UserError as exc:
        return None, exc.line()
    except (OSError, ValueError, RecursionError) as exc:
        return None, f"cannot be read ({exc})"
    if records.skipped:
        # One line a run, however many of its lines are left out.
        more = len(records.skipped) - 1
        skipped.append(records.skipped[0] + (f" (and {more} more of its lines, left out too)" if more else ""))
    return PastRun(
        run_id=meta.run_id or directory.name,
        name=directory.name,
        started_at=meta.started_at or "",
        records={r.key: r for r in records},
        current=current,
    ), ""


def load_history(
    run_dir: Path,
    limit: int = DEFAULT_LIMIT,
    skipped: list[str] | None = None,
    current_records: Sequence[ItemRecord] | None = None,
) -> list[PastRun]:
    """``run_dir`` and the runs beside it, oldest first, at most ``limit`` of them. A sibling
    that cannot be read is left out, and said in ``skipped`` (one line each) when given; so is each
    line of a sibling's results that is not a record. ``current_records``: ``run_dir``'s records,
    where the caller holds them (they are not read again)."""
    run_dir = run_dir.resolve()
    runs: list[PastRun] = []
    left_out: list[str] = []
    try:
        siblings = sorted(p for p in run_dir.parent.iterdir() if p.is_dir())
    except OSError:
        siblings = [run_dir]
    for directory in siblings:
        current = directory == run_dir
        if not current and (
            # A hidden directory is no run (a merge's staging directory, a tool's own).
            directory.name.startswith(".")
            or not ((directory / RUN_FILE).is_file() and (directory / RESULTS_FILE).is_file())
        ):
            continue
        run, why = _load(directory, current, left_out, current_records if current else None)
        if run is not None:
            runs.append(run)
        else:
            left_out.append(f"{directory.name}: {why}")
    if skipped is not None:
        skipped.extend(left_out)
    runs.sort(key=lambda r: (r.started_at, r.name))
    if len(runs) > limit:
        older = [r for r in runs[:-limit] if r.current]
        keep = limit - len(older)
        runs = older + (runs[-keep:] if keep > 0 else [])
    return runs


def history_items(runs: list[PastRun]) -> list[Key]:
    """Every item seen, the current run's first (in its order), then the rest by name."""
    current = next((r for r in runs if r.current), None)
    first = list(current.records) if current else []
    rest = sorted({k for r in runs for k in r.records} - set(first))
    return first + rest
