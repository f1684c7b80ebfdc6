"""``run``, as a list of steps (as nox's ``__main__`` runs its tasks): **open** the run directory
(a new one, or the interrupted run ``--resume`` goes on with) and claim it; **sweep** what dead runs
left; **begin**: ``run.json`` written, what is left to do said; then, with the stop signals the
run's, start the run's executor and **dispatch** the items, each cell's as its **environments**
step makes the cell's environment ready; **finish**: ``run.json`` and the reports written, the exit
status. What a step needs lives where it belongs: the run's metadata in ``records/run_meta.py``,
what the run says as it goes in ``reports/progress.py``, the signals in ``signals.py``, an item's
attempts in ``item_runner.py`` (through ``dispatch.py``).

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
import shlex
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console

from harness.config.matrix import Cell
from harness.config.repros import BrokenRepro
from harness.core.errors import EXIT_USAGE, UserError
from harness.core.invocation import program
from harness.core.json import JsonValue
from harness.core.text import plain
from harness.environments import Environments
from harness.execution.containment import cgroups
from harness.execution.containment.leftovers import sweep_dead_runs
from harness.execution.scheduler import Machine
from harness.pipeline.cell_state import cell_meta
from harness.pipeline.dispatch import Dispatch, ItemPolicy
from harness.pipeline.environment_stage import EnvironmentStage, ReadyCell, builders_for
from harness.pipeline.executors import Executor, ExecutorContext, make_executor
from harness.pipeline.observe import broken_record
from harness.pipeline.signals import RunInterrupted, stop_signals
from harness.planning.items import Plan, PlannedItem, plan_items
from harness.planning.run_options import RunOptions
from harness.records.item import ItemRecord
from harness.records.results import ResultsWriteError
from harness.records.run_dir import RunDir
from harness.records.run_meta import CellMeta, MatrixRef, RunMeta, new_run_id, utc_now
from harness.reports.finalize import finalize
from harness.reports.progress import RunProgress

EXIT_INTERRUPTED = 130


def start_meta(
    opts: RunOptions, plan: Plan, run_id: str, environments: Environments, argv: Sequence[str], **more: object
) -> RunMeta:
    """``run.json`` as a run (or a pytest session) starts: its options, its plan, its environments."""
    shard = {"shard": plan.shard} if plan.shard is not None else {}
    return RunMeta.started(
        run_id,
        argv,
        options=opts.stored(),
        matrix=MatrixRef(path=str(opts.matrix.path), sha256=opts.matrix.sha256),
        lane=opts.selection.lane or opts.matrix.default_lane,
        as_of=opts.stack.as_of,
        cache_dir=str(environments.cache_dir),
        index=environments.index.key_material(),
        planned=[i.id.label() for i in plan.items],
        excluded=plan.excluded,
        broken_repros={k: v.reason for k, v in opts.discovery.broken.items()},
        cells={},
        **shard,
        **more,
    )


#: Called once a run's reports are written: its records, its run.json, whether it was interrupted;
#: returns what the command adds to run.json (``grid``, ...), if anything.
RunEnding = Callable[[Sequence[ItemRecord], RunMeta, bool], Mapping[str, JsonValue] | None]


def exit_status(records: Sequence[ItemRecord]) -> int:
    """0 when every observation matched its expectation or was explored (a finding), 1 otherwise:
    a missed expectation, or an explored item that could not run."""
    return 0 if records and not any(r.counts_against for r in records) else 1


@dataclasses.dataclass(frozen=True)
class Todo:
    """What is left to run: the planned items without a record, and the repros that could not be
    loaded in their cells (an INFRA record each)."""

    items: list[PlannedItem]
    broken: list[tuple[Cell, BrokenRepro]]

    def by_cell(self) -> dict[str, list[PlannedItem]]:
        cells: dict[str, list[PlannedItem]] = {}
        for item in self.items:
            cells.setdefault(item.cell.name, []).append(item)
        return cells


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
        #: The run directory, once opened, and the run's id.
        self.path: Path | None = None
        self.run_id = ""
        #: The run's executor while its items run.
        self.executor: Executor | None = None
        #: What the run says while its items run.
        self.progress: RunProgress | None = None

    def _say(self, text: str) -> None:
        self.console.print(plain(text), highlight=False, markup=False)

    def _doing(self, text: str) -> None:
        if self.progress is not None:
            self.progress.doing(text)

    def _hung_up(self) -> None:
        # The terminal is gone: writing to it would fail (EIO) before run.json and the reports say
        # the run was interrupted. They are what is left to read.
        self.console.quiet = True

    def execute(self) -> int:
        """The run, step by step; its exit status (0 all matched, 1 otherwise, 2 when a record could
        not be written, 130 when interrupted)."""
        run_dir = self.open()
        with run_dir.locked():
            self.claim(run_dir)
            self.sweep()
            todo = self.begin(run_dir)
            with stop_signals(on_hangup=self._hung_up), self.stopping(run_dir):
                executor = self.start_executor(run_dir)
                with self.dispatching(run_dir, todo, executor) as dispatch:
                    self.make_environments_ready(run_dir, todo, dispatch, executor)
            return self.finish(run_dir)

    # ------------------------------------------------------------------ open, sweep, begin

    def open(self) -> RunDir:
        """The run directory: a new one and its ``run.json`` as the run starts, or (``--resume``)
        the interrupted run's, its records so far and its ``run.json`` with this resumption."""
        if self.resume is not None:
            run_dir = RunDir.existing(self.resume)
            meta = run_dir.read_meta(required=True)
            records = run_dir.records()
            for note in records.duplicates:
                self._say(f"note: {note}")
            self.records = list(records)
            self.meta = meta.evolve(resumed_at=[*meta.resumed_at, utc_now()])
            self.run_id = meta.run_id or self.resume.name
        else:
            self.run_id = new_run_id()
            run_dir = RunDir.create(self.opts.out_dir or (self.opts.reports_dir / self.run_id))
            self.meta = start_meta(self.opts, self.plan, self.run_id, self.environments, self.argv, kind=self.kind)
        self.path = run_dir.path
        return run_dir

    def claim(self, run_dir: RunDir) -> None:
        """The run directory is this run's (its lock is held): a new run's holds nothing of
        another's (two runs given one ``--out``); a resumed run's half-done writes are removed."""
        held = run_dir.held_file()
        if self.resume is None and held is not None:
            raise UserError(
                run_dir.path, held, "already holds the results of another run", "choose a new --out directory"
            )
        if self.resume is not None:
            run_dir.remove_partial_writes()

    def sweep(self) -> None:
        """What dead runs left (their processes, their ``/dev/shm``) swept, and said."""
        swept = sweep_dead_runs()
        self.meta = self.meta.evolve(isolation=cgroups.describe())
        if swept:
            earlier = self.meta.model_extra.get("swept_at_start", []) if self.meta.model_extra else []
            self.meta = self.meta.evolve(swept_at_start=[*earlier, swept.as_record()])
            self._say(swept.describe())

    def begin(self, run_dir: RunDir) -> Todo:
        """``run.json`` written as the run starts; what is left to do, said."""
        done = {r.key for r in self.records}
        todo = Todo(
            [i for i in self.plan.items if (i.cell.name, i.repro_id, i.mode) not in done],
            [(c, b) for c, b in self.plan.broken if (c.name, b.id, "bug") not in done],
        )
        self.meta = self.meta.evolve(interrupted=None)
        run_dir.write_meta(self.meta)
        for stem, broken in self.opts.discovery.broken.items():
            self._say(f"repro {stem} ({broken.module}) is broken: {broken.reason}")
        verb = f"resuming {self.run_id}: {len(done)} items already done, " if self.resume else f"run {self.run_id}: "
        if self.plan.shard is not None:
            shard = self.plan.shard
            verb += f"shard {shard.index}/{shard.count} of {len(shard.planned_all)} items: "
        self._say(f"{verb}{len(todo.items)} items → {run_dir.path}")
        return todo

    # ------------------------------------------------------------------ the executor, dispatch, environments

    @contextmanager
    def stopping(self, run_dir: RunDir) -> Iterator[None]:
        """How the items' span ends short: an interrupt or a record that cannot be written is kept
        for ``finish`` to say; a usage error met once the run had started (its executor could not
        start) finishes ``run.json`` with it, then is raised. The executor is closed either way."""
        try:
            yield
        except KeyboardInterrupt:
            self.interrupted = "SIGINT"
        except RunInterrupted as exc:
            self.interrupted = str(exc)
        except ResultsWriteError as exc:
            self.write_error = str(exc)
        except UserError as exc:
            self.meta = self.meta.evolve(finished_at=utc_now(), failed=exc.line())
            self._write_meta(run_dir)
            raise
        finally:
            executor, self.executor = self.executor, None
            if executor is not None:
                executor.close()
                for name, info in executor.workers().items():
                    found = self.cells.get(name) or self.meta.cells.get(name) or CellMeta()
                    self.cells[name] = found.model_copy(update={"worker": info})

    def start_executor(self, run_dir: RunDir) -> Executor:
        """The run's executor, made once the stop signals are the run's (a cluster slow to answer is
        stopped like an item, and ``run.json`` says so); what it says of where items run, where that
        is not where they were asked to (a Slurm executor on this machine), said as the run starts."""
        self.executor = make_executor(
            ExecutorContext(run_dir, self.run_id, self.opts.executor, self.opts.cache, self.environments)
        )
        note = self.executor.describe().get("note")
        if note:
            self._say(f"note: {note}")
        return self.executor

    @contextmanager
    def dispatching(self, run_dir: RunDir, todo: Todo, executor: Executor) -> Iterator[Dispatch]:
        """Items go to ``executor`` through the ``Dispatch`` yielded; each record is appended to the
        results as it comes, and said. The repros that could not be loaded get their INFRA records
        first. On leaving, every item submitted is recorded (or, on an interrupt, stopped)."""
        with run_dir.writer() as writer, RunProgress(self.console, len(todo.items)) as progress:
            self.progress = progress
            if writer.repaired is not None:
                self._say(f"set aside a torn last line of {writer.path} ({len(writer.repaired)} characters)")

            def record(item_record: ItemRecord) -> None:
                writer.append(item_record)
                if self.meta.first_record_at is None:
                    self.meta = self.meta.evolve(
                        first_record_at=dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")
                    )
                self.records.append(item_record)
                progress.finished(item_record)

            for cell, broken in todo.broken:
                unloadable = broken_record(self.run_id, cell, broken)
                writer.append(unloadable)
                self.records.append(unloadable)
                self._say(f"✗ {cell.name}/{broken.id}: INFRA ({broken.reason})")
            dispatch = Dispatch(
                self.opts,
                self.run_id,
                run_dir,
                executor,
                record,
                progress.running,
                self.policy,
                on_cell=self._cell_ready(run_dir),
            )
            try:
                yield dispatch
                dispatch.drain()
            except BaseException:
                dispatch.abort()
                raise
            finally:
                self.meta = self.meta.evolve(concurrency=dispatch.concurrency())
                unrecorded = dispatch.unrecorded_attempts()
                if unrecorded or self.meta.unrecorded_attempts:
                    self.meta = self.meta.evolve(unrecorded_attempts=unrecorded)

    def make_environments_ready(self, run_dir: RunDir, todo: Todo, dispatch: Dispatch, executor: Executor) -> None:
        """Each cell's items dispatched once its environment is ready: made ready here, cell by
        cell, where the executor runs items on this machine; by each node itself otherwise."""
        if executor.builds_environments:
            self._environments_here(run_dir, todo.by_cell(), dispatch)
        else:
            self._environments_on_nodes(todo.by_cell(), dispatch)

    def _environments_here(self, run_dir: RunDir, by_cell: dict[str, list[PlannedItem]], dispatch: Dispatch) -> None:
        """Each cell's items as soon as its environment is ready, the environments made ready in the
        background meanwhile (``environment_stage.py``)."""
        cells = [items[0].cell for items in by_cell.values()]
        counts = {name: len(items) for name, items in by_cell.items()}
        stage = EnvironmentStage(self.environments, cells, builders_for(Machine.detect(), len(cells)), counts)

        def items_of(ready: ReadyCell) -> None:
            cell, resolved = ready.cell, ready.resolved
            if resolved.env is not None:
                self._say(f"{cell.name}: environment {resolved.env.key} {self.environments.readiness(resolved.env)}")
                if resolved.env.repaired:
                    self._say(f"{cell.name}: {resolved.env.repaired}")
            else:
                self._say(f"{cell.name}: environment unavailable\n{resolved.reason}")
            self._cell_ready(run_dir)(cell.name, cell_meta(cell, resolved))
            dispatch.submit(by_cell[cell.name], resolved)
            underway = stage.underway()
            if underway:
                self._doing(f"environments: {', '.join(underway)}")

        prepare = getattr(dispatch.executor, "prepare", None)  # optional (``Executor``)

        def on_ready(ready: ReadyCell) -> None:
            if prepare is not None:
                prepare(ready.resolved, ready.cell.name)

        try:
            stage.dispatch_as_ready(dispatch, items_of, one_at_a_time=self.opts.executor.jobs == 1, on_ready=on_ready)
        finally:
            self.meta = self.meta.evolve(environment_stage=stage.describe())

    def _environments_on_nodes(self, by_cell: dict[str, list[PlannedItem]], dispatch: Dispatch) -> None:
        """Each node makes the cell's environment ready itself (its first item says how), from one lock
        resolved here: every node builds the same packages."""
        for cell_name, items in by_cell.items():
            cell = items[0].cell
            lock = self.environments.lock_for_nodes(cell)
            if lock is not None:
                cell = dataclasses.replace(cell, lock=lock)
                items = [dataclasses.replace(item, cell=cell) for item in items]
                self._say(f"{cell_name}: its floating specs resolved to {len(lock)} packages for every node")
            dispatch.submit(items, None)

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

    # ------------------------------------------------------------------ finish

    def finish(self, run_dir: RunDir) -> int:
        """``run.json`` finished, the reports written, what the command adds, the exit status."""
        self.meta = self.meta.evolve(finished_at=utc_now(), interrupted=self.interrupted, write_error=self.write_error)
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
