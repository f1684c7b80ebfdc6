"""The ``run`` pipeline, as small steps: plan the items, open the run directory, get each cell's
environment, dispatch the items to the launcher, record each as it finishes, finalize.

Every user error is found before anything runs. A cell whose environment cannot be built gives
UNRESOLVABLE records for its items and the run goes on. Ctrl-C, SIGTERM or SIGHUP (a closed
terminal, a cancelled CI job) stops the items in flight and keeps every record already written,
and ``run.json`` and the reports say the run was interrupted, and by what; a record that cannot be
written (a full disk) stops the run with exit 2, keeping what was written.

``run.json`` is written as the run starts and as it ends (interrupted or not), not once a cell:
each cell's environment is appended to the run directory's ``cells.jsonl`` as it is made ready
(``RunDir.append_cell``), so a run of ten thousand cells writes ``run.json`` three times.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import resource
import secrets
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from harness import __version__
from harness.config.matrix import Cell
from harness.config.repros import BrokenRepro
from harness.core.errors import EXIT_USAGE, UserError
from harness.core.invocation import program, program_text
from harness.core.json import JsonValue
from harness.core.text import plain
from harness.environments import Environments
from harness.execution.containment import cgroups
from harness.execution.containment.leftovers import sweep_dead_runs
from harness.execution.launchers.supervision import WORKER_PACKAGE_DIR
from harness.pipeline.cell_state import cell_meta
from harness.pipeline.dispatch import Dispatch, ItemPolicy
from harness.pipeline.executors import Executor, ExecutorContext, make_executor
from harness.pipeline.observe import broken_record, now
from harness.planning.items import Plan, PlannedItem, plan_items
from harness.planning.run_options import RunOptions
from harness.records.item import ItemRecord, counts_text
from harness.records.provenance import host_info
from harness.records.results import ResultsWriteError
from harness.records.run_dir import RunDir
from harness.records.run_meta import CellMeta, MatrixRef, RunMeta
from harness.reports.finalize import finalize

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


def start_meta(
    opts: RunOptions, plan: Plan, run_id: str, environments: Environments, argv: Sequence[str], **more: object
) -> RunMeta:
    """``run.json`` as a run (or a pytest session) starts."""
    shard = {"shard": plan.shard} if plan.shard is not None else {}
    return RunMeta.model_validate(
        {
            "run_id": run_id,
            "started_at": now(),
            "argv": list(argv),
            "program": program_text(),
            "options": opts.stored(),
            "harness_version": __version__,
            "git_commit": git_commit(),
            "matrix": MatrixRef(path=str(opts.matrix.path), sha256=opts.matrix.sha256),
            "lane": opts.selection.lane or opts.matrix.default_lane,
            "as_of": opts.stack.as_of,
            "host": host_info(),
            "cache_dir": str(environments.cache_dir),
            "index": environments.index.key_material(),
            "planned": [i.id.label() for i in plan.items],
            "excluded": plan.excluded,
            "broken_repros": {k: v.reason for k, v in opts.discovery.broken.items()},
            "cells": {},
            **shard,
            **more,
        }
    )


def progress_line(record: ItemRecord) -> str:
    """One line per finished item: outcome against expectation, time, and the error."""
    if record.matched:
        mark, against = "✓", f"expected {record.expected}"
        if record.flaky and record.attempts:
            first = record.attempts[0].outcome
            against += f"; flaky: {first} first, matched on attempt {len(record.attempts) + 1}"
    elif record.is_finding:
        mark, against = "·", "explored" + (f", expected {record.expected}" if record.expected else "")
    elif record.expected is None:
        # Variants and grid combinations carry no expectation: what they observe is the finding.
        mark, against = "·", "no expectation"
    else:
        mark, against = "✗", f"expected {record.expected}"
    line = f"{mark} {record.id.label()}: {record.outcome} ({against}) {record.wall_s:.1f}s"
    if record.outcome_counts:
        line += f" [{counts_text(record.outcome_counts)} of {record.repeat}]"
    error = record.error
    if error:
        message = error.message
        line += f" - {error.type}: {message[:160]}{'…' if len(message) > 160 else ''}"
    elif record.reasons:
        line += f" - {record.reasons[0].splitlines()[0][:160] if record.reasons[0] else ''}"
    return plain(line)


#: A run of at least this many items says where it stands every ``PACE_EVERY_ITEMS`` items or
#: ``PACE_EVERY_S`` seconds, whichever comes first.
PACE_MIN_ITEMS = 10
PACE_EVERY_ITEMS = 10
PACE_EVERY_S = 60.0


def pace_text(done: int, total: int, elapsed_s: float) -> str:
    """Where a long run stands, for a log without the live bar: items done of the total, the rate so
    far, and when the rest should be done at that rate."""
    if done <= 0 or elapsed_s <= 0:
        return f"{done}/{total}"
    per_minute = 60 * done / elapsed_s
    left = max(total - done, 0)
    eta = left / per_minute * 60 if per_minute else 0.0
    return f"{done}/{total} · {per_minute:.1f} items/min · ETA {_duration(eta)}"


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


#: Called once a run's reports are written: its records, its run.json, whether it was interrupted;
#: returns what the command adds to run.json (``grid``, ...), if anything.
RunEnding = Callable[[Sequence[ItemRecord], RunMeta, bool], Mapping[str, JsonValue] | None]


class RunInterrupted(Exception):
    """SIGTERM or SIGHUP arrived: stop like on Ctrl-C, keeping what finished."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise RunInterrupted(signal.Signals(signum).name)


#: The signals that stop a run like Ctrl-C: ``kill``, a CI job cancelled, a terminal closed.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def exit_status(records: Sequence[ItemRecord]) -> int:
    """0 when every observation matched its expectation or was explored (a finding), 1 otherwise:
    a missed expectation, or an explored item that could not run."""
    return 0 if records and not any(r.counts_against for r in records) else 1


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
        on_finished: RunEnding | None = None,
    ) -> None:
        self.policy = policy
        #: What the command prints (and does) once the run's reports are written.
        self.on_finished = on_finished
        self.opts = opts
        self.console = console
        self.argv = argv
        self.resume = resume
        self.kind = kind
        self.plan = plan if plan is not None else plan_items(opts)
        self.environments = Environments(opts.cache.path, cache_max_gb=opts.cache.cache_max_gb)
        self.records: list[ItemRecord] = []
        #: Each cell's environment as this run found it (added to ``run.json`` when it is written).
        self.cells: dict[str, CellMeta] = {}
        self.interrupted: str | None = None
        self.write_error: str | None = None
        #: The run's metadata as it stands (a new value at each change; written by ``RunDir``).
        self.meta = RunMeta()
        #: The run directory, once opened.
        self.path: Path | None = None

    def _open(self) -> tuple[RunDir, str]:
        if self.resume is not None:
            run_dir = RunDir.existing(self.resume)
            meta = run_dir.read_meta(required=True)
            records = run_dir.records()
            for note in records.duplicates:
                self._say(f"note: {note}")
            self.records = list(records)
            self.meta = meta.evolve(resumed_at=[*meta.resumed_at, now()])
            return run_dir, meta.run_id or self.resume.name
        run_id = new_run_id()
        run_dir = RunDir.create(self.opts.out_dir or (self.opts.reports_dir / run_id))
        self.meta = start_meta(self.opts, self.plan, run_id, self.environments, self.argv, kind=self.kind)
        return run_dir, run_id

    def _on_stop_signal(self, signum: int, frame: object) -> None:
        if signum == signal.SIGHUP:
            # The terminal is gone: writing to it would fail (EIO) before run.json and the reports
            # say the run was interrupted. They are what is left to read.
            self.console.quiet = True
        _on_sigterm(signum, frame)

    def _say(self, text: str) -> None:
        self.console.print(plain(text), highlight=False, markup=False)

    def execute(self) -> int:
        run_dir, run_id = self._open()
        self.path = run_dir.path
        with run_dir.locked():
            held = run_dir.held_file()
            if self.resume is None and held is not None:
                # Another run got here first (two runs given one --out).
                raise UserError(
                    run_dir.path, held, "already holds the results of another run", "choose a new --out directory"
                )
            if self.resume is not None:
                run_dir.remove_partial_writes()  # what the interrupted run's writes left half done
            self._clean_up_after_dead_runs()
            return self._execute(run_dir, run_id)

    def _clean_up_after_dead_runs(self) -> None:
        swept = sweep_dead_runs()
        self.meta = self.meta.evolve(isolation=cgroups.describe())
        if swept:
            earlier = self.meta.model_extra.get("swept_at_start", []) if self.meta.model_extra else []
            self.meta = self.meta.evolve(swept_at_start=[*earlier, swept.as_record()])
            self._say(swept.describe())

    def _execute(self, run_dir: RunDir, run_id: str) -> int:
        done = {r.key for r in self.records}
        todo = [i for i in self.plan.items if (i.cell.name, i.repro_id, i.mode) not in done]
        broken_todo = [(c, b) for c, b in self.plan.broken if (c.name, b.id, "bug") not in done]
        self.meta = self.meta.evolve(interrupted=None)
        run_dir.write_meta(self.meta)
        for stem, broken in self.opts.discovery.broken.items():
            self._say(f"repro {stem} ({broken.module}) is broken: {broken.reason}")
        verb = f"resuming {run_id}: {len(done)} items already done, " if self.resume else f"run {run_id}: "
        if self.plan.shard is not None:
            shard = self.plan.shard
            verb += f"shard {shard.index}/{shard.count} of {len(shard.planned_all)} items: "
        self._say(f"{verb}{len(todo)} items → {run_dir.path}")

        previous = {
            signum: signal.signal(signum, self._on_stop_signal)
            for signum in STOP_SIGNALS
            # A run started under ``nohup`` asked to outlive its terminal: SIGHUP stays ignored.
            if not (signum == signal.SIGHUP and signal.getsignal(signum) == signal.SIG_IGN)
        }
        # Ctrl-C must interrupt even when the run was started with SIGINT ignored (a
        # background job of a non-interactive shell inherits it ignored).
        previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
        executor: Executor | None = None
        try:
            # Made once the stop signals are the run's: a cluster slow to answer is stopped like an
            # item, and run.json says so.
            executor = make_executor(
                ExecutorContext(run_dir, run_id, self.opts.executor, self.opts.cache, self.environments)
            )
            self._say_executor_note(executor)
            self._run_items(run_dir, run_id, todo, broken_todo, executor)
        except KeyboardInterrupt:
            self.interrupted = "SIGINT"
        except RunInterrupted as exc:
            self.interrupted = str(exc)
        except ResultsWriteError as exc:
            self.write_error = str(exc)
        except UserError as exc:
            self._stopped_by(run_dir, exc)
            raise
        finally:
            if executor is not None:
                executor.close()
                for name, info in executor.workers().items():
                    found = self.cells.get(name) or self.meta.cells.get(name) or CellMeta()
                    self.cells[name] = found.model_copy(update={"worker": info})
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            signal.signal(signal.SIGINT, previous_int)
        return self._finish(run_dir)

    def _say_executor_note(self, executor: Executor) -> None:
        """What the executor says of where items run, where it is not where they were asked to (a
        Slurm executor on this machine), plainly, as the run starts (``run.json`` keeps it too)."""
        note = executor.describe().get("note")
        if note:
            self._say(f"note: {note}")

    def _stopped_by(self, run_dir: RunDir, error: UserError) -> None:
        """A usage error met once the run had started (its executor could not start): ``run.json``
        is finished with it, never left saying the run is under way."""
        self.meta = self.meta.evolve(finished_at=now(), failed=error.line())
        self._write_meta(run_dir)

    def _run_items(
        self,
        run_dir: RunDir,
        run_id: str,
        todo: list[PlannedItem],
        broken_todo: list[tuple[Cell, BrokenRepro]],
        executor: Executor,
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
                TimeRemainingColumn(),
                console=self.console,
                transient=True,
            ) as progress,
        ):
            if writer.repaired is not None:
                self._say(f"set aside a torn last line of {writer.path} ({len(writer.repaired)} characters)")
            task = progress.add_task("items", total=len(todo))
            started = time.monotonic()
            pace = {"done": 0, "said": started}

            def record(item_record: ItemRecord) -> None:
                writer.append(item_record)
                self.records.append(item_record)
                progress.advance(task)
                self._say(progress_line(item_record))
                # A log has no live bar: every tenth item, or a minute after the last word, where the run stands.
                pace["done"] += 1
                now_s = time.monotonic()
                if (
                    len(todo) >= PACE_MIN_ITEMS
                    and pace["done"] < len(todo)
                    and (pace["done"] % PACE_EVERY_ITEMS == 0 or now_s - pace["said"] >= PACE_EVERY_S)
                ):
                    pace["said"] = now_s
                    self._say(f"progress: {pace_text(int(pace['done']), len(todo), now_s - started)}")

            def running(count: int) -> None:
                if count:
                    progress.update(task, description=f"{count} items queued or running")

            for cell, broken in broken_todo:
                unloadable = broken_record(run_id, cell, broken)
                writer.append(unloadable)
                self.records.append(unloadable)
                self._say(f"✗ {cell.name}/{broken.id}: INFRA ({broken.reason})")
            dispatch = Dispatch(
                self.opts, run_id, run_dir, executor, record, running, self.policy, on_cell=self._cell_ready(run_dir)
            )
            try:
                for cell_name, items in by_cell.items():
                    cell = items[0].cell
                    if not executor.builds_environments:
                        # Each node makes the cell's environment ready itself (its first item says how),
                        # from one lock resolved here: every node builds the same packages.
                        lock = self.environments.lock_for_nodes(cell)
                        if lock is not None:
                            cell = dataclasses.replace(cell, lock=lock)
                            items = [dataclasses.replace(item, cell=cell) for item in items]
                            self._say(
                                f"{cell_name}: its floating specs resolved to {len(lock)} packages for every node"
                            )
                        dispatch.submit(items, None)
                        continue
                    if self.opts.executor.jobs == 1:
                        # One item at a time: nothing else runs while an environment is built.
                        dispatch.drain()
                    progress.update(task, description=f"{cell_name}: environment")
                    resolved = self.environments.for_cell(cell)
                    if resolved.env is not None:
                        self._say(
                            f"{cell_name}: environment {resolved.env.key} {self.environments.readiness(resolved.env)}"
                        )
                        if resolved.env.repaired:
                            self._say(f"{cell_name}: {resolved.env.repaired}")
                    else:
                        self._say(f"{cell_name}: environment unavailable\n{resolved.reason}")
                    self._cell_ready(run_dir)(cell_name, cell_meta(cell, resolved))
                    dispatch.submit(items, resolved)
                dispatch.drain()
            except BaseException:
                dispatch.abort()
                raise
            finally:
                self.meta = self.meta.evolve(concurrency=dispatch.concurrency())
                unrecorded = dispatch.unrecorded_attempts()
                if unrecorded or self.meta.unrecorded_attempts:
                    self.meta = self.meta.evolve(unrecorded_attempts=unrecorded)

    def _cell_ready(self, run_dir: RunDir) -> Callable[[str, CellMeta], None]:
        """Keep a cell's environment as the run found it (``cells.jsonl`` now, ``run.json`` at the end)."""

        def ready(cell_name: str, meta: CellMeta) -> None:
            self.cells[cell_name] = meta
            try:
                run_dir.append_cell(cell_name, meta)
            except OSError as exc:  # a full disk: stop cleanly, keeping what was written
                raise ResultsWriteError(f"{run_dir.cells_path}: could not be written ({exc.strerror or exc})") from exc

        return ready

    def _write_meta(self, run_dir: RunDir) -> None:
        try:
            if self.cells:
                self.meta = self.meta.evolve(cells={**self.meta.cells, **self.cells})
                self.cells = {}
            run_dir.write_meta(self.meta)
            run_dir.clear_appended_cells()
        except OSError as exc:
            message = f"{run_dir.meta_path}: could not be written ({exc.strerror or exc})"
            self.write_error = "; ".join(filter(None, [self.write_error, message]))

    def _finish(self, run_dir: RunDir) -> int:
        self.meta = self.meta.evolve(finished_at=now(), interrupted=self.interrupted, write_error=self.write_error)
        self._write_meta(run_dir)
        done = finalize(run_dir)
        if self.on_finished is not None:
            added = self.on_finished(self.records, self.meta, self.interrupted is not None)
            if added:
                self.meta = self.meta.evolve(**added)
        self._say(f"results: {run_dir.results_path}")
        for path in done.written:
            self._say(f"report: {path}")
        if done.failed:
            self.write_error = "; ".join([*filter(None, [self.write_error]), *done.failed])
            self.meta = self.meta.evolve(write_error=self.write_error)
        # The orchestrator's own high-water mark, the report included (the ranks are not in it).
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        self.meta = self.meta.evolve(orchestrator_peak_rss_bytes=peak)
        self._write_meta(run_dir)
        resume_cmd = shlex.join([*program(), "run", "--resume", str(run_dir.path.resolve())])
        if self.write_error:
            self._say(f"error: {self.write_error}; the records written so far are kept. Free space, then: {resume_cmd}")
            return EXIT_USAGE
        if self.interrupted:
            left = self.plan.size - len(self.records)
            kept = self.meta.unrecorded_attempts
            went = sum(len(dirs) for dirs in kept.values())
            on = f" ({went} finished attempts of {len(kept)} of them kept, each with its record)" if kept else ""
            self._say(f"interrupted by {self.interrupted}: {left} items not run{on}; resume with: {resume_cmd}")
            return EXIT_INTERRUPTED
        return exit_status(self.records)
