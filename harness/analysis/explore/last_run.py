"""The run whose observations ``run --save-expectations`` saves without running anything again.

A user explores (``run``), reads what was observed, then keeps it (``run --save-expectations``):
the second command saves what the first saw. The last run in the reports directory is taken where
it observed every item now planned, on the same stacks: it finished, of the same matrix (its
content), with the same options choosing the stacks (``--pin``, ``--as-of``, ``--model``,
``--world-size``, ``--family``), and no repro file or script it ran has changed since it started.
Anything else, and the items are run again.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.config.repros import Repro
from harness.planning.items import PlannedItem
from harness.planning.run_options import RunOptions, StackChoice
from harness.records.item import ItemRecord
from harness.records.run_dir import RunDir
from harness.records.run_meta import RunMeta
from repros.runtime.kinds import is_file_ref
from repros.runtime.kinds.script import PARAM

#: How many of the newest run directories are looked at.
LOOKED_AT = 20


@dataclass(frozen=True)
class LastRun:
    dir: RunDir
    meta: RunMeta
    #: Its records of the planned items, in plan order.
    records: list[ItemRecord]


def _files_of(repro: Repro) -> list[Path]:
    """The files a user's repro is: its file, and the scripts its declaration runs."""
    if not is_file_ref(repro.module):
        return []
    files = [Path(repro.module)]
    declared = repro.rank_params.get(PARAM)
    if isinstance(declared, dict):
        for key in ("command", "fixed"):
            command = declared.get(key)
            if isinstance(command, dict) and isinstance(command.get("path"), str):
                files.append(Path(command["path"]))
    return files


def _changed_since(files: Iterable[Path], started: dt.datetime) -> bool:
    for path in files:
        try:
            if dt.datetime.fromtimestamp(path.stat().st_mtime, dt.UTC) >= started:
                return True
        except OSError:
            return True
    return False


def _started(meta: RunMeta) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(str(meta.started_at)) if meta.started_at else None
    except ValueError:
        return None


def last_observed(opts: RunOptions, items: Sequence[PlannedItem]) -> LastRun | None:
    """The newest run under ``opts.reports_dir`` that observed every one of ``items`` as they would be
    observed now, else None."""
    try:
        runs = [p for p in opts.reports_dir.iterdir() if (p / "run.json").is_file()]
    except OSError:
        return None
    runs.sort(key=lambda p: (p / "run.json").stat().st_mtime, reverse=True)
    repros = opts.discovery.repros
    files = [f for repro_id in dict.fromkeys(i.repro_id for i in items) for f in _files_of(repros[repro_id])]
    for path in runs[:LOOKED_AT]:
        run = RunDir(path)
        try:
            meta = run.read_meta()
        except Exception:  # noqa: BLE001 - a run directory that cannot be read is simply not the one
            continue
        started = _started(meta)
        if meta.kind != "run" or not meta.finished_at or meta.interrupted or started is None:
            continue
        if meta.matrix is None or meta.matrix.sha256 != opts.matrix.sha256 or meta.options is None:
            continue
        try:
            if StackChoice.restored(meta.options) != opts.stack:
                continue
        except Exception:  # noqa: BLE001 - options this harness cannot read: not comparable
            continue
        if _changed_since(files, started):
            continue
        by_item = {(r.cell, r.repro, r.mode): r for r in run.records()}
        wanted = [(i.cell.name, i.repro_id, i.mode) for i in items]
        if all(key in by_item for key in wanted):
            return LastRun(run, meta, [by_item[key] for key in wanted])
    return None
