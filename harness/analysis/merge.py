"""``merge OUT SHARD_DIR...``: the shards of one sharded run become one run directory.

``OUT`` gets ``results.jsonl`` (every shard's records, in the order of the whole
plan), ``run.json`` (each shard's provenance under ``shards``; hosts, cells and
exclusions merged), ``junit.xml`` and the HTML report, so ``report`` and ``compare``
treat it like any run. The shards must fit together: an item recorded by two
shards, or shards that planned different wholes (they were balanced by different
histories), is a usage error. Shards that are missing, items no shard recorded, and a
shard's torn last record (its run killed while writing it) are listed in ``run.json``
(``incomplete``) and printed, the torn one as "torn"; they are not an error, so one lost
runner still leaves a night's report. The merged plan is the shards' plans (``run.json``
``planned``), never just the records found: an item planned and not recorded stays in it,
named as not run.
"""

from __future__ import annotations

import datetime as dt
import os
import secrets
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness.core.errors import UserError
from harness.core.json import JsonObject
from harness.records.item import ItemRecord
from harness.records.results import RESULTS_FILE, Records, ResultsWriteError, torn_line
from harness.records.run_dir import RunDir
from harness.records.run_meta import CellMeta, ExcludedItem, RunMeta


@dataclass
class Merged:
    run_dir: RunDir
    records: list[ItemRecord]
    meta: RunMeta
    #: Lines for the user: missing shards, items no shard recorded.
    warnings: list[str] = field(default_factory=list)


def _read_shard(directory: Path) -> tuple[list[ItemRecord], RunMeta]:
    run = RunDir(directory)
    if not run.results_path.is_file():
        raise UserError(directory, "", f"holds no {RESULTS_FILE}", "pass the output directory of each shard's run")
    return run.records(), run.read_meta()


def _check_shards(dirs: Sequence[Path], metas: Sequence[RunMeta]) -> tuple[list[str] | None, list[str]]:
    """The whole plan the shards agree on (None when none was sharded) and warnings."""
    sharded = [(d, m.shard) for d, m in zip(dirs, metas, strict=True) if m.shard is not None]
    if not sharded:
        return None, []
    first_dir, first = sharded[0]
    seen: dict[int, Path] = {}
    for directory, shard in sharded:
        if shard.count != first.count or shard.planned_all != first.planned_all:
            raise UserError(
                directory,
                "run.json shard",
                f"was planned as a different whole than {first_dir} (shard {shard.index}/{shard.count})",
                "give every shard the same matrix, repros and --reports-dir history, then rerun the shards",
            )
        if shard.index in seen:
            raise UserError(
                directory,
                "run.json shard",
                f"is shard {shard.index}/{shard.count} again (also {seen[shard.index]})",
                "pass each shard's directory once",
            )
        seen[shard.index] = directory
    missing = [i for i in range(1, first.count + 1) if i not in seen]
    warnings = [f"shard {i}/{first.count} missing" for i in missing]
    return list(first.planned_all), warnings


def _merged_cells(metas: Sequence[RunMeta]) -> dict[str, CellMeta]:
    cells: dict[str, CellMeta] = {}
    for meta in metas:
        for name, cell in meta.cells.items():
            cells.setdefault(name, cell)
    return cells


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def merge_runs(out: Path, shard_dirs: Sequence[Path]) -> Merged:
    if not shard_dirs:
        raise UserError("merge", "SHARD_DIR", "no shard directories given", "pass OUT and then each shard's directory")
    held = RunDir(out).held_file()
    if held is not None:
        raise UserError(out, held, "already holds the results of a run", "choose a new OUT directory")
    loaded = [_read_shard(d) for d in shard_dirs]
    metas = [meta for _, meta in loaded]
    planned_all, warnings = _check_shards(shard_dirs, metas)
    # A shard's item recorded twice in its own results is counted once (its last record): said.
    repeated = [note for records, _ in loaded if isinstance(records, Records) for note in records.duplicates]
    torn = []
    for directory, (shard_records, _) in zip(shard_dirs, loaded, strict=True):
        line = torn_line(shard_records)
        if line is not None:
            torn.append(line.describe())
            warnings.append(
                f"{line.describe()}: left out of the merge; `run --resume {directory}` records it again, "
                "then merge again"
            )

    owner: dict[str, Path] = {}
    records: list[ItemRecord] = []
    for directory, (shard_records, _) in zip(shard_dirs, loaded, strict=True):
        for record in shard_records:
            key = record.id.label()
            if key in owner:
                raise UserError(
                    directory,
                    RESULTS_FILE,
                    f"records {key}, which {owner[key]} records too",
                    "pass each shard's directory once, and only shards of one run",
                )
            owner[key] = directory
            records.append(record)
    if planned_all is None:
        # Runs that were not shards: their plans, one after another, then whatever they recorded
        # beyond them (a torn or lost record never shrinks the plan).
        planned_all = list(dict.fromkeys([*(k for m in metas for k in m.planned), *(r.id.label() for r in records)]))
    position = {k: i for i, k in enumerate(planned_all)}
    records.sort(key=lambda r: position.get(r.id.label(), len(position)))
    not_run = [k for k in planned_all if k not in owner]
    if not_run:
        warnings.append(f"{len(not_run)} planned items have no record: {', '.join(not_run[:10])}")

    excluded: dict[str, ExcludedItem] = {}
    for meta in metas:
        for item in meta.excluded:
            excluded.setdefault(item.label, item)

    run_id = "merged-" + dt.datetime.now().strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)
    first = metas[0] if metas else RunMeta()
    commits = {m.git_commit for m in metas}
    if len(commits) > 1:
        warnings.append(f"shards ran different commits: {', '.join(sorted(str(c) for c in commits))}")
    incomplete: JsonObject = {"warnings": warnings, "not_run": not_run}
    if torn:
        incomplete["torn"] = torn
    more: JsonObject = {"incomplete": incomplete} if warnings else {}
    if repeated:
        more["repeated_records"] = repeated
        warnings += repeated
    meta = RunMeta.model_validate(
        {
            "run_id": run_id,
            "kind": first.kind,
            "merged_at": _now(),
            "started_at": min((m.started_at for m in metas if m.started_at), default=None),
            "finished_at": max((m.finished_at for m in metas if m.finished_at), default=None),
            "matrix": first.matrix,
            "lane": first.lane,
            "harness_version": first.harness_version,
            "git_commit": first.git_commit,
            "planned": planned_all,
            "excluded": list(excluded.values()),
            "cells": _merged_cells(metas),
            "hosts": [m.host for m in metas],
            "shards": [
                {
                    "dir": str(directory),
                    "run_id": m.run_id,
                    "shard": m.shard.index if m.shard else None,
                    "items": len(shard_records),
                    "host": m.host,
                    "git_commit": m.git_commit,
                    "matrix": m.matrix.model_dump() if m.matrix else None,
                    "started_at": m.started_at,
                    "finished_at": m.finished_at,
                    "interrupted": m.interrupted,
                }
                for directory, (shard_records, m) in zip(shard_dirs, loaded, strict=True)
            ],
            **more,
        }
    )
    return Merged(run_dir=_write_atomically(out, records, meta), records=records, meta=meta, warnings=warnings)


def _write_atomically(out: Path, records: list[ItemRecord], meta: RunMeta) -> RunDir:
    """Write the merged run beside ``out`` and move it into place in one rename: a merge cut
    short leaves ``out`` as it was, so it can simply be run again."""
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(
            out, "OUT", f"cannot be created ({exc.strerror})", "choose a directory you can write to"
        ) from None
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(out, "OUT", "exists and is not empty", "choose a new OUT directory")
    staging_path = out.parent / f".{out.name}.merging-{os.getpid()}"
    shutil.rmtree(staging_path, ignore_errors=True)  # left by a merge of this process id that was killed
    staging = RunDir.create(staging_path)
    try:
        with staging.writer() as writer:
            for record in records:
                writer.append(record)
        staging.write_meta(meta)
        os.replace(staging.path, out)
    except (OSError, ResultsWriteError) as exc:
        shutil.rmtree(staging.path, ignore_errors=True)
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise UserError(
            out, "OUT", f"could not be written ({why}); nothing was left there", "free space, then merge again"
        ) from None
    except BaseException:
        shutil.rmtree(staging.path, ignore_errors=True)
        raise
    return RunDir(out)
