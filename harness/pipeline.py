"""The ``run`` pipeline, as small steps: plan the items, open the run directory, get each cell's
environment, dispatch the items to the launcher, record each as it finishes, finalize.

Every user error is found before anything runs. A cell whose environment cannot be built gives
UNRESOLVABLE records for its items and the run goes on. Ctrl-C or SIGTERM stops the items in
flight and keeps every record already written; a record that cannot be written (a full disk)
stops the run with exit 2, keeping what was written.
"""

from __future__ import annotations

import datetime as dt
import resource
import secrets
import shlex
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from harness import __version__, cgroups
from harness.dispatch import Dispatch, ItemPolicy
from harness.environments import Environment, Environments, Resolved
from harness.errors import EXIT_USAGE, UserError
from harness.explore import findings_lines
from harness.finalize import finalize
from harness.invocation import program, program_text
from harness.launchers import LauncherContext, make_launcher
from harness.launchers.supervision import WORKER_PACKAGE_DIR
from harness.leftovers import sweep_dead_runs
from harness.matrix import Cell
from harness.observe import broken_record, now
from harness.planning import Plan, PlannedItem, RunOptions, plan_items
from harness.provenance import host_info
from harness.records import ItemRecord, counts_against, is_finding, key
from harness.rerun import selection_command
from harness.results import RESULTS_FILE, ResultsWriteError
from harness.run_dir import RunDir, RunMeta
from harness.save_expectations import save_observed
from harness.summary import print_summary
from harness.terminal import plain

EXIT_INTERRUPTED = 130


def new_run_id() -> str:
    return dt.datetime.now().strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)


def git_commit() -> str | None:
    """The harness's own commit, where it runs from a checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=WORKER_PACKAGE_DIR.parent, capture_output=True, text=True, check=False
        )
    except OSError:
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def options_record(opts: RunOptions) -> dict[str, Any]:
    """What ``run --resume`` needs to plan and run the same items again, the same way."""
    return {
        "matrix": str(opts.matrix.path),
        "lane": opts.lane,
        "cells": list(opts.cells),
        "repros": list(opts.repros),
        "modes": list(opts.modes),
        "pins": [list(p) for p in opts.pins],
        "repros_dirs": [str(d) for d in opts.repros_dirs],
        "cache_dir": str(opts.cache_dir) if opts.cache_dir_given else None,
        "shard": str(opts.shard) if opts.shard else None,
        "reports_dir": str(opts.reports_dir),
        "launcher": opts.launcher,
        "jobs": opts.jobs,
        "reruns": opts.reruns,
        "model": opts.model,
        "explore": opts.explore,
    }


def start_meta(
    opts: RunOptions, plan: Plan, run_id: str, environments: Environments, argv: Sequence[str], **more: Any
) -> RunMeta:
    """``run.json`` as a run (or a pytest session) starts."""
    meta: RunMeta = {
        "run_id": run_id,
        "started_at": now(),
        "argv": list(argv),
        "program": program_text(),
        "options": options_record(opts),
        "harness_version": __version__,
        "git_commit": git_commit(),
        "matrix": {"path": str(opts.matrix.path), "sha256": opts.matrix.sha256},
        "lane": opts.lane or opts.matrix.default_lane,
        "host": host_info(),
        "cache_dir": str(environments.cache_dir),
        "index": environments.index.key_material(),
        "planned": [i.id.label() for i in plan.items],
        "excluded": plan.excluded,
        "broken_repros": {k: v.reason for k, v in opts.discovery.broken.items()},
        "cells": {},
        **more,
    }
    if plan.shard is not None:
        meta["shard"] = plan.shard
    return meta


def cell_meta(cell: Cell, resolved: Resolved) -> dict[str, Any]:
    env = resolved.env
    if env is None:
        return {"unavailable": resolved.reason, "requested": cell.packages}
    return {
        "key": env.key,
        "reused": env.reused,
        "build_s": env.build_s,
        "python": env.python_version,
        "requested": cell.packages,
        "packages": env.packages,
        "extensions_dir": env.extensions_dir,
        **({"repaired": env.repaired} if env.repaired else {}),
    }


def progress_line(record: ItemRecord) -> str:
    """One line per finished item: outcome against expectation, time, and the error."""
    if record["matched"]:
        mark, against = "✓", f"expected {record['expected']}"
        if record.get("flaky"):
            first = record["attempts"][0]["outcome"]
            against += f"; flaky: {first} first, matched on attempt {len(record['attempts']) + 1}"
    elif is_finding(record):
        mark, against = "·", "explored" + (f", expected {record['expected']}" if record.get("expected") else "")
    elif record["expected"] is None:
        # Variants and grid combinations carry no expectation: what they observe is the finding.
        mark, against = "·", "no expectation"
    else:
        mark, against = "✗", f"expected {record['expected']}"
    line = (
        f"{mark} {record['cell']}/{record['repro']}/{record['mode']}: {record['outcome']} "
        f"({against}) {record['wall_s']:.1f}s"
    )
    error = record.get("error")
    if error:
        message = error.get("message") or ""
        line += f" - {error.get('type')}: {message[:160]}{'…' if len(message) > 160 else ''}"
    elif record.get("reasons"):
        line += f" - {record['reasons'][0].splitlines()[0][:160]}"
    return plain(line)


def how_ready(env: Environment) -> str:
    if env.passthrough:
        return "passthrough"
    return "reused" if env.reused else f"built in {env.build_s:.1f}s"


class RunInterrupted(Exception):
    """SIGTERM arrived: stop like on Ctrl-C, keeping what finished."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise RunInterrupted(signal.Signals(signum).name)


def exit_status(records: Sequence[ItemRecord]) -> int:
    """0 when every observation matched its expectation or was explored (a finding), 1 otherwise:
    a missed expectation, or an explored item that could not run."""
    return 0 if records and not any(counts_against(r) for r in records) else 1


class RunSession:
    """One ``run`` (or ``run --resume``) into one run directory."""

    def __init__(
        self,
        opts: RunOptions,
        console: Console,
        argv: Sequence[str],
        resume: Path | None,
        plan: Plan | None = None,
        kind: str = "run",
        policy: ItemPolicy | None = None,
    ) -> None:
        self.policy = policy
        self.opts = opts
        self.console = console
        self.argv = argv
        self.resume = resume
        self.kind = kind
        self.plan = plan if plan is not None else plan_items(opts)
        assert opts.cache_dir is not None
        self.environments = Environments(opts.cache_dir)
        self.records: list[ItemRecord] = []
        self.interrupted: str | None = None
        self.write_error: str | None = None

    def _open(self) -> tuple[RunDir, RunMeta, str]:
        if self.resume is not None:
            run_dir = RunDir.existing(self.resume)
            meta = run_dir.read_meta(required=True)
            self.records = run_dir.records()
            meta.setdefault("resumed_at", []).append(now())
            return run_dir, meta, str(meta.get("run_id") or self.resume.name)
        run_id = new_run_id()
        run_dir = RunDir.create(self.opts.out_dir or (self.opts.reports_dir / run_id))
        meta = start_meta(self.opts, self.plan, run_id, self.environments, self.argv, kind=self.kind)
        return run_dir, meta, run_id

    def _say(self, text: str) -> None:
        self.console.print(plain(text), highlight=False, markup=False)

    def execute(self) -> int:
        run_dir, meta, run_id = self._open()
        with run_dir.locked():
            if self.resume is None and (run_dir.results_path.exists() or run_dir.meta_path.exists()):
                # Another run got here first (two runs given one --out).
                raise UserError(run_dir.path, RESULTS_FILE, "already holds the results of another run", "choose a new --out directory")
            self._clean_up_after_dead_runs(meta)
            return self._execute(run_dir, meta, run_id)

    def _clean_up_after_dead_runs(self, meta: RunMeta) -> None:
        swept = sweep_dead_runs()
        meta["isolation"] = cgroups.describe()
        if swept:
            meta.setdefault("swept_at_start", []).append(swept.as_record())
            self._say(
                f"cleaned up after a killed run: {len(swept.processes)} processes, "
                f"{len(swept.shm_segments)} /dev/shm segments, {len(swept.cgroups)} cgroups"
            )

    def _execute(self, run_dir: RunDir, meta: RunMeta, run_id: str) -> int:
        done = {key(r) for r in self.records}
        todo = [i for i in self.plan.items if (i.cell.name, i.repro_id, i.mode) not in done]
        broken_todo = [(c, b) for c, b in self.plan.broken if (c.name, b.id, "bug") not in done]
        meta.pop("interrupted", None)
        run_dir.write_meta(meta)
        for stem, broken in self.opts.discovery.broken.items():
            self._say(f"repro {stem} ({broken.module}) is broken: {broken.reason}")
        verb = f"resuming {run_id}: {len(done)} items already done, " if self.resume else f"run {run_id}: "
        if self.plan.shard is not None:
            shard = self.plan.shard
            verb += f"shard {shard['index']}/{shard['count']} of {len(shard['planned_all'])} items: "  # type: ignore[arg-type]
        self._say(f"{verb}{len(todo)} items → {run_dir.path}")

        launcher = make_launcher(self.opts.launcher, LauncherContext(log_dir=run_dir.workers_dir))
        previous_term = signal.signal(signal.SIGTERM, _on_sigterm)
        # Ctrl-C must interrupt even when the run was started with SIGINT ignored (a
        # background job of a non-interactive shell inherits it ignored).
        previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            self._run_items(run_dir, meta, run_id, todo, broken_todo, launcher)
        except KeyboardInterrupt:
            self.interrupted = "SIGINT"
        except RunInterrupted as exc:
            self.interrupted = str(exc)
        except ResultsWriteError as exc:
            self.write_error = str(exc)
        finally:
            launcher.close()
            for name, info in launcher.describe().items():
                meta["cells"].setdefault(name, {})["worker"] = info
            signal.signal(signal.SIGTERM, previous_term)
            signal.signal(signal.SIGINT, previous_int)
        return self._finish(run_dir, meta)

    def _run_items(
        self,
        run_dir: RunDir,
        meta: RunMeta,
        run_id: str,
        todo: list[PlannedItem],
        broken_todo: list[Any],
        launcher: Any,
    ) -> None:
        by_cell: dict[str, list[PlannedItem]] = {}
        for item in todo:
            by_cell.setdefault(item.cell.name, []).append(item)
        with (
            run_dir.writer() as writer,
            Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=self.console,
                transient=True,
            ) as progress,
        ):
            if writer.repaired is not None:
                self._say(f"set aside a torn last line of {writer.path} ({len(writer.repaired)} characters)")
            task = progress.add_task("items", total=len(todo))

            def record(item_record: ItemRecord) -> None:
                writer.append(item_record)
                self.records.append(item_record)
                progress.advance(task)
                self._say(progress_line(item_record))

            def running(count: int) -> None:
                if count:
                    progress.update(task, description=f"{count} items queued or running")

            for cell, broken in broken_todo:
                writer.append(broken_record(run_id, cell, broken))
                self.records.append(broken_record(run_id, cell, broken))
                self._say(f"✗ {cell.name}/{broken.id}: INFRA ({broken.reason})")
            dispatch = Dispatch(self.opts, run_id, run_dir, launcher, record, running, self.environments, self.policy)
            try:
                for cell_name, items in by_cell.items():
                    cell = items[0].cell
                    if self.opts.jobs == 1:
                        # One item at a time: nothing else runs while an environment is built.
                        dispatch.drain()
                    progress.update(task, description=f"{cell_name}: environment")
                    resolved = self.environments.for_cell(cell)
                    if resolved.env is not None:
                        self._say(f"{cell_name}: environment {resolved.env.key} {how_ready(resolved.env)}")
                        if resolved.env.repaired:
                            self._say(f"{cell_name}: {resolved.env.repaired}")
                    else:
                        self._say(f"{cell_name}: environment unavailable\n{resolved.reason}")
                    meta["cells"][cell_name] = cell_meta(cell, resolved)
                    run_dir.write_meta(meta)
                    dispatch.submit(items, resolved)
                dispatch.drain()
            except BaseException:
                dispatch.abort()
                raise
            finally:
                meta["concurrency"] = dispatch.concurrency()

    def _write_meta(self, run_dir: RunDir, meta: RunMeta) -> None:
        try:
            run_dir.write_meta(meta)
        except OSError as exc:
            message = f"{run_dir.meta_path}: could not be written ({exc.strerror or exc})"
            self.write_error = "; ".join(filter(None, [self.write_error, message]))

    def _explored(self, meta: RunMeta) -> None:
        """What each explored repro did in each cell; saved as expectations where asked."""
        cells_meta = meta.get("cells") or {}
        explored = findings_lines(self.records, cells_meta)
        for line in explored:
            self._say(line)
        if explored and not self.opts.save_expectations:
            self._say("keep them as expectations: add --save-expectations")
        if self.opts.save_expectations and not self.interrupted:

            def established_by(repro: str, cells: list[str]) -> str:
                return selection_command(self.opts, cells, [repro], "--explore")

            save_observed(self.records, cells_meta, self.opts.discovery, established_by, self._say)

    def _finish(self, run_dir: RunDir, meta: RunMeta) -> int:
        meta["finished_at"] = now()
        if self.interrupted:
            meta["interrupted"] = self.interrupted
        if self.write_error:
            meta["write_error"] = self.write_error
        self._write_meta(run_dir, meta)
        done = finalize(run_dir)
        if self.kind == "run":
            print_summary(self.console, self.records, self.plan.excluded)
            self._explored(meta)
        self._say(f"results: {run_dir.results_path}")
        for path in done.written:
            self._say(f"report: {path}")
        if done.failed:
            self.write_error = "; ".join([*filter(None, [self.write_error]), *done.failed])
            meta["write_error"] = self.write_error
        # The orchestrator's own high-water mark, the report included (the ranks are not in it).
        meta["orchestrator_peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        self._write_meta(run_dir, meta)
        resume_cmd = shlex.join([*program(), "run", "--resume", str(run_dir.path.resolve())])
        if self.write_error:
            self._say(f"error: {self.write_error}; the records written so far are kept. Free space, then: {resume_cmd}")
            return EXIT_USAGE
        if self.interrupted:
            left = self.plan.size - len(self.records)
            self._say(f"interrupted by {self.interrupted}: {left} items not run; resume with: {resume_cmd}")
            return EXIT_INTERRUPTED
        return exit_status(self.records)


def execute(opts: RunOptions, console: Console, argv: Sequence[str] = (), resume: Path | None = None) -> int:
    """Run the planned items; return the exit status (0 all matched, 1 otherwise, 2 when a record
    could not be written, 130 when interrupted). With ``resume``, run only what that run lacks."""
    return RunSession(opts, console, argv, resume).execute()
