"""The ``run`` pipeline: plan the items, get each cell's environment, launch each
item, classify it, compare with its expectation, append its record, summarise.

Every user error is found before anything runs. A cell whose environment cannot be
built gives UNRESOLVABLE records for its items and the run goes on.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import resource
import secrets
import shlex
import signal
import subprocess
import threading
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

import repros
from harness import __version__
from harness.cell_worker import WorkerGone, WorkerPool
from harness.environments import (
    Environment,
    EnvironmentUnavailable,
    EnvRequest,
    UvEnvironments,
    passthrough_environment,
)
from harness.errors import UserError
from harness.expectations import expectation_for
from harness.html_report import write_report
from harness.junit import JUNIT_FILE, write_junit
from harness.launch import LaunchResult, kill_in_flight, launch_item
from harness.matrix import Cell, Matrix
from harness.outcome import classify
from harness.package_index import pip_index_config
from harness.provenance import host_info
from harness.repro_registry import BrokenRepro, Discovery, Repro
from harness.results import RESULTS_FILE, ItemId, ResultsWriter, item_record, read_results, unobserved_record
from harness.scheduler import Demand, Machine, Slots
from harness.shard import Shard, assign, durations_from, shard_meta
from harness.summary import print_summary
from repros.common.spec import MODES

#: The directory that holds the ``repros`` package: the ranks' PYTHONPATH.
REPO_ROOT = Path(repros.__file__).resolve().parent.parent


LAUNCHERS = ("worker", "torchrun")


def default_launcher() -> str:
    """``$FT_REGRESS_LAUNCHER`` when it names a launcher, else the pre-imported worker."""
    chosen = os.environ.get("FT_REGRESS_LAUNCHER", "")
    return chosen if chosen in LAUNCHERS else "worker"


@dataclass(frozen=True)
class RunOptions:
    matrix: Matrix
    discovery: Discovery
    lane: str | None = None
    cells: tuple[str, ...] = ()
    repros: tuple[str, ...] = ()
    modes: tuple[str, ...] = MODES
    out_dir: Path | None = None
    reports_dir: Path = Path("reports")
    cache_dir: Path | None = None
    cache_dir_given: bool = False
    #: Packages pinned over every selected cell's own spec (``--pin deepspeed==0.19.5``).
    pins: tuple[tuple[str, str], ...] = ()
    repros_dirs: tuple[Path, ...] = ()
    #: Run only this shard of the plan (``--shard I/N``), balanced by ``reports_dir``'s history.
    shard: Shard | None = None
    #: The shard's items as first planned (``--resume`` keeps them, whatever the history says now).
    shard_items: tuple[str, ...] | None = None
    #: "worker": ranks forked from the cell's pre-imported worker; "torchrun": a bare torchrun per item.
    launcher: str = "worker"
    #: Items run at once, at most; 0: as many as the machine's cores, memory and GPUs fit.
    jobs: int = 1


@dataclass(frozen=True)
class PlannedItem:
    cell: Cell
    repro_id: str
    module: str
    mode: str
    world_size: int

    @property
    def id(self) -> ItemId:
        return ItemId(self.cell.name, self.repro_id, self.mode)


@dataclass
class Plan:
    items: list[PlannedItem] = field(default_factory=list)
    excluded: list[dict[str, Any]] = field(default_factory=list)
    #: Repro files that could not be loaded, with each cell they would have run in.
    broken: list[tuple[Cell, BrokenRepro]] = field(default_factory=list)
    #: With ``--shard``: the whole plan and this shard's part of it (for ``run.json``).
    shard: dict[str, Any] | None = None


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def new_run_id() -> str:
    return dt.datetime.now().strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)


def plan_items(opts: RunOptions) -> Plan:
    matrix, known = opts.matrix, opts.discovery.repros
    for wanted in opts.repros:
        if wanted not in known and wanted not in opts.discovery.broken:
            raise UserError("--repros", wanted, "unknown repro", f"use one of: {', '.join(sorted(known))}")
    for mode in opts.modes:
        if mode not in MODES:
            raise UserError("--modes", mode, "unknown mode", f"use one of: {', '.join(MODES)}")
    if opts.cells:
        for name in opts.cells:
            if name not in matrix.cells:
                raise UserError(
                    matrix.path, "cells", f"no cell named {name!r}", f"use one of: {', '.join(matrix.cells)}"
                )
        cells = [matrix.cells[n] for n in opts.cells]
        if opts.lane:
            cells = [c for c in cells if opts.lane in c.lanes]
    else:
        lane = opts.lane or matrix.default_lane
        cells = matrix.cells_in_lane(lane) if lane else list(matrix.cells.values())
    if opts.pins:
        cells = [pinned_cell(c, opts.pins) for c in cells if not c.passthrough]
    plan = Plan()
    for cell in cells:
        for stem, broken in sorted(opts.discovery.broken.items()):
            if not opts.repros or stem in opts.repros:
                plan.broken.append((cell, broken))
        # The order asked for with --repros, else by id.
        order = [r for r in opts.repros if r in known] if opts.repros else sorted(known)
        for repro_id in order:
            repro = known[repro_id]
            if cell.repros is not None and repro_id not in cell.repros:
                continue
            for mode in repro.spec.modes:
                if mode not in opts.modes:
                    continue
                exclusion = matrix.exclusion(cell.name, repro_id, mode)
                if exclusion is not None:
                    plan.excluded.append(
                        {"cell": cell.name, "repro": repro_id, "mode": mode, "reason": exclusion.reason}
                    )
                    continue
                world_size = repro.spec.world_size or cell.world_size
                plan.items.append(PlannedItem(cell, repro_id, repro.module, mode, world_size))
    if opts.shard is not None:
        _keep_shard(plan, opts, opts.shard)
    return plan


def _broken_label(cell: Cell, broken: BrokenRepro) -> str:
    return ItemId(cell.name, broken.id, "bug").label()


def _keep_shard(plan: Plan, opts: RunOptions, shard: Shard) -> None:
    """Keep only ``shard``'s part of the whole plan (see ``harness.shard``)."""
    labels = [i.id.label() for i in plan.items] + [_broken_label(c, b) for c, b in plan.broken]
    durations = durations_from(opts.reports_dir)
    if opts.shard_items is not None:
        mine = set(opts.shard_items)
    else:
        mine = set(assign(labels, durations, shard.count)[shard.index - 1])
    plan.items = [i for i in plan.items if i.id.label() in mine]
    plan.broken = [(c, b) for c, b in plan.broken if _broken_label(c, b) in mine]
    plan.shard = shard_meta(shard, labels, [k for k in labels if k in mine], durations, opts.reports_dir)


def prepare_out_dir(opts: RunOptions, run_id: str) -> Path:
    out = opts.out_dir or (opts.reports_dir / run_id)
    if (out / RESULTS_FILE).exists():
        raise UserError(out, RESULTS_FILE, "already holds the results of another run", "choose a new --out directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise UserError(
            out, "--out", f"cannot be written ({exc.strerror})", "choose a directory you can write to"
        ) from None
    return out


def pinned_cell(cell: Cell, pins: tuple[tuple[str, str], ...]) -> Cell:
    """``cell`` with some packages pinned over its own specs; named after its origin."""
    suffix = "+".join(f"{name}-{spec.lstrip('=<>!~')}" for name, spec in pins)
    return dataclasses.replace(
        cell,
        name=f"{cell.name}+{suffix}",
        packages={**cell.packages, **dict(pins)},
        origin=cell.origin or cell.name,
    )


def run_command(
    matrix: Path, cell: Cell, repro: str, mode: str, pins: tuple[tuple[str, str], ...], cache_dir: Path | None
) -> str:
    """One command that reruns a single item alone."""
    args = ["python", "-m", "harness", "run", "--matrix", str(matrix), "--cells", cell.origin or cell.name]
    args += ["--repros", repro, "--modes", mode]
    for name, spec in pins:
        args += ["--pin", f"{name}{spec}"]
    if cache_dir is not None:
        args += ["--cache-dir", str(cache_dir)]
    return shlex.join(args)


def repro_command(opts: RunOptions, item: PlannedItem) -> str:
    cache = opts.cache_dir if opts.cache_dir_given else None
    return run_command(opts.matrix.path, item.cell, item.repro_id, item.mode, opts.pins, cache)


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    except OSError:
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _write_run_json(out: Path, meta: dict[str, Any]) -> None:
    tmp = out / "run.json.tmp"
    tmp.write_text(json.dumps(meta, indent=1, sort_keys=True, default=str))
    os.replace(tmp, out / "run.json")


def environment_for(cell: Cell, builder: UvEnvironments, cache_dir: Path) -> Environment:
    if cell.passthrough:
        return passthrough_environment(cache_dir)
    return builder.get(EnvRequest(packages=cell.packages, python=cell.python, exclude_newer=cell.exclude_newer))


def observe_item(
    *,
    run_id: str,
    item: PlannedItem,
    repro: Repro,
    env: Environment | None,
    unavailable_reason: str,
    out: Path,
    repro_cmd: str,
    workers: WorkerPool | None = None,
    gpus: Sequence[str] = (),
) -> dict[str, Any]:
    """Launch one item in ``env`` and return its result record (UNRESOLVABLE without an env).

    With ``workers``, the ranks are forked from the cell's pre-imported worker; where the
    cell cannot have one, torchrun starts them and the record says why."""
    started = _now()
    if env is None:
        return unobserved_record(
            outcome="UNRESOLVABLE",
            error_type="EnvironmentUnavailable",
            run_id=run_id,
            item=item.id,
            reason=unavailable_reason,
            world_size=item.world_size,
            repro_cmd=repro_cmd,
            started_at=started,
            finished_at=_now(),
        )
    item_dir = (out / "items" / item.cell.name / f"{item.repro_id}-{item.mode}").resolve()
    extra_env = {"CUDA_VISIBLE_DEVICES": ",".join(gpus)} if gpus else {}
    launch = _launch(item, env, item_dir, workers, extra_env)
    observation = classify(item.mode, repro.spec, launch)
    record = item_record(
        run_id=run_id,
        item=item.id,
        observation=observation,
        expected=expectation_for(repro.spec, item.mode, {**env.packages, "python": env.python_version}),
        env=env,
        launch=launch,
        repro_cmd=repro_cmd,
        item_dir=item_dir,
        started_at=started,
        finished_at=_now(),
    )
    if workers is not None and launch.launcher != "worker":
        record["launcher_fallback"] = workers.reason(env)
    if gpus:
        record["gpus_leased"] = list(gpus)
    return record


def _launch(
    item: PlannedItem, env: Environment, item_dir: Path, workers: WorkerPool | None, extra_env: dict[str, str]
) -> LaunchResult:
    timeout = item.cell.timeout_s
    for _ in range(3):
        worker = workers.get(env, item.cell.name) if workers is not None else None
        if worker is None:
            break
        try:
            return worker.launch(item.module, item.mode, item.world_size, item_dir, timeout, extra_env)
        except WorkerGone:
            continue  # closed or dead before it forked anything: the pool starts another
    return launch_item(env, item.module, item.mode, item.world_size, item_dir, timeout, REPO_ROOT, extra_env)


class _Dispatch:
    """Runs the planned items on worker threads, as many at once as ``--jobs`` and the
    machine's free cores, memory and GPUs allow (``scheduler.Slots``), and records each on
    the main thread as it finishes. A cell's worker is closed once its last item is done."""

    def __init__(
        self,
        opts: RunOptions,
        run_id: str,
        out: Path,
        workers: WorkerPool | None,
        writer: ResultsWriter,
        records: list[dict[str, Any]],
        console: Console,
        progress: Progress,
        task: TaskID,
    ) -> None:
        self.opts = opts
        self.run_id = run_id
        self.out = out
        self.workers = workers
        self.writer = writer
        self.records = records
        self.console = console
        self.progress = progress
        self.task = task
        self.machine = Machine.detect()
        self.slots = Slots(self.machine, opts.jobs)
        self.stop = threading.Event()
        self.pending: set[Future[dict[str, Any] | None]] = set()
        self.left_in_cell: dict[str, int] = {}
        self.env_of_cell: dict[str, Environment] = {}
        threads = opts.jobs or self.machine.cpus
        self.executor = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="item")

    def submit(self, items: list[PlannedItem], env: Environment | None, reason: str) -> None:
        for item in items:
            self.left_in_cell[item.cell.name] = self.left_in_cell.get(item.cell.name, 0) + 1
            if env is not None:
                self.env_of_cell[item.cell.name] = env
            self.pending.add(self.executor.submit(self._observe, item, env, reason))
        self._collect(block=False)

    def _observe(self, item: PlannedItem, env: Environment | None, reason: str) -> dict[str, Any] | None:
        with self.slots.hold(Demand.for_item(item.world_size, self.machine)) as gpus:
            if self.stop.is_set():
                return None
            return observe_item(
                run_id=self.run_id,
                item=item,
                repro=self.opts.discovery.repros[item.repro_id],
                env=env,
                unavailable_reason=reason,
                out=self.out,
                repro_cmd=repro_command(self.opts, item),
                workers=self.workers,
                gpus=gpus,
            )

    def _collect(self, block: bool) -> None:
        done, _ = wait(self.pending, timeout=0.2 if block else 0, return_when=FIRST_COMPLETED)
        for future in done:
            self.pending.discard(future)
            record = future.result()
            if record is None or self.stop.is_set():
                continue
            self.writer.append(record)
            self.records.append(record)
            self.progress.advance(self.task)
            self.console.print(progress_line(record), highlight=False, markup=False)
            cell = record["cell"]
            self.left_in_cell[cell] -= 1
            if self.left_in_cell[cell] == 0 and self.workers is not None and cell in self.env_of_cell:
                self.workers.retire(self.env_of_cell[cell])
        running = len(self.pending)
        if running:
            self.progress.update(self.task, description=f"{running} items queued or running")

    def drain(self) -> None:
        while self.pending:
            self._collect(block=True)

    def abort(self) -> None:
        """Stop: no new item starts, the running ones are killed, their records dropped."""
        self.stop.set()
        kill_in_flight()
        if self.workers is not None:
            self.workers.abort()
        self.executor.shutdown(wait=True, cancel_futures=True)
        kill_in_flight()

    def concurrency(self) -> dict[str, Any]:
        return {"jobs": self.opts.jobs, "machine": self.machine.describe(), "most_at_once": self.slots.peak}


class RunInterrupted(Exception):
    """SIGTERM arrived: stop like on Ctrl-C, keeping what finished."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise RunInterrupted(signal.Signals(signum).name)


def _options_record(opts: RunOptions) -> dict[str, Any]:
    """What ``run --resume`` needs to plan the same items again."""
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
    }


def _cell_meta(cell: Cell, env: Environment | None, reason: str) -> dict[str, Any]:
    if env is None:
        return {"unavailable": reason, "requested": cell.packages}
    return {
        "key": env.key,
        "reused": env.reused,
        "build_s": env.build_s,
        "python": env.python_version,
        "requested": cell.packages,
        "packages": env.packages,
        "extensions_dir": env.extensions_dir,
    }


def _record_workers(meta: dict[str, Any], workers: WorkerPool) -> None:
    """Each cell's worker in run.json: how long it took to be ready, and what it imported."""
    for name, info in workers.started_by_cell().items():
        meta["cells"].setdefault(name, {})["worker"] = dataclasses.asdict(info)
    for name, reason in workers.unavailable_by_cell().items():
        meta["cells"].setdefault(name, {})["worker"] = {"unavailable": reason}


def progress_line(record: dict[str, Any]) -> str:
    """One line per finished item: outcome against expectation, time, and the error."""
    mark = "✓" if record["matched"] else "✗"
    line = (
        f"{mark} {record['cell']}/{record['repro']}/{record['mode']}: {record['outcome']} "
        f"(expected {record['expected']}) {record['wall_s']:.1f}s"
    )
    error = record.get("error")
    if error:
        message = error.get("message") or ""
        line += f" - {error.get('type')}: {message[:160]}{'…' if len(message) > 160 else ''}"
    elif record.get("reasons"):
        line += f" - {record['reasons'][0].splitlines()[0][:160]}"
    return line


def _how(env: Environment) -> str:
    if env.passthrough:
        return "passthrough"
    return "reused" if env.reused else f"built in {env.build_s:.1f}s"


def _broken_record(run_id: str, cell: Cell, broken: BrokenRepro) -> dict[str, Any]:
    now = _now()
    return unobserved_record(
        outcome="INFRA",
        error_type="ReproUnloadable",
        run_id=run_id,
        item=ItemId(cell.name, broken.id, "bug"),
        reason=f"{broken.module}: {broken.reason}",
        world_size=cell.world_size,
        repro_cmd=shlex.join(["python", "-c", f"import runpy; runpy.run_path({broken.module!r})"]),
        started_at=now,
        finished_at=now,
    )


def execute(opts: RunOptions, console: Console, argv: Sequence[str] = (), resume: Path | None = None) -> int:
    """Run the planned items; return the exit status (0 all matched, 1 otherwise,
    130 when interrupted). With ``resume``, run only what that run directory lacks."""
    plan = plan_items(opts)
    cache_dir = opts.cache_dir
    assert cache_dir is not None
    builder = UvEnvironments(cache_dir, pip_index_config())
    records: list[dict[str, Any]] = []
    if resume is not None:
        out = resume
        meta = json.loads((out / "run.json").read_text())
        run_id = meta["run_id"]
        records = read_results(out / RESULTS_FILE) if (out / RESULTS_FILE).exists() else []
        meta.setdefault("resumed_at", []).append(_now())
    else:
        run_id = new_run_id()
        out = prepare_out_dir(opts, run_id)
        meta = {
            "run_id": run_id,
            "started_at": _now(),
            "argv": list(argv),
            "options": _options_record(opts),
            "harness_version": __version__,
            "git_commit": _git_commit(),
            "matrix": {"path": str(opts.matrix.path), "sha256": opts.matrix.sha256},
            "lane": opts.lane or opts.matrix.default_lane,
            "host": host_info(),
            "cache_dir": str(cache_dir),
            "index": builder.index.key_material(),
            "planned": [i.id.label() for i in plan.items],
            "excluded": plan.excluded,
            "broken_repros": {k: v.reason for k, v in opts.discovery.broken.items()},
            "cells": {},
        }
        if plan.shard is not None:
            meta["shard"] = plan.shard
    done = {(r["cell"], r["repro"], r["mode"]) for r in records}
    todo = [i for i in plan.items if (i.cell.name, i.repro_id, i.mode) not in done]
    broken_todo = [(c, b) for c, b in plan.broken if (c.name, b.id, "bug") not in done]
    meta.pop("interrupted", None)
    _write_run_json(out, meta)
    for stem, broken in opts.discovery.broken.items():
        console.print(f"repro {stem} ({broken.module}) is broken: {broken.reason}", highlight=False, markup=False)
    verb = f"resuming {run_id}: {len(done)} items already done, " if resume else f"run {run_id}: "
    if plan.shard is not None:
        verb += f"shard {plan.shard['index']}/{plan.shard['count']} of {len(plan.shard['planned_all'])} items: "
    console.print(f"{verb}{len(todo)} items → {out}", highlight=False)

    by_cell: dict[str, list[PlannedItem]] = {}
    for item in todo:
        by_cell.setdefault(item.cell.name, []).append(item)

    interrupted: str | None = None
    workers = WorkerPool(REPO_ROOT, out / "workers") if opts.launcher == "worker" else None
    previous_term = signal.signal(signal.SIGTERM, _on_sigterm)
    # Ctrl-C must interrupt even when the run was started with SIGINT ignored (a
    # background job of a non-interactive shell inherits it ignored).
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with (
            ResultsWriter(out / RESULTS_FILE) as writer,
            Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
                transient=True,
            ) as progress,
        ):
            task = progress.add_task("items", total=len(todo))
            for cell, broken in broken_todo:
                record = _broken_record(run_id, cell, broken)
                writer.append(record)
                records.append(record)
                console.print(f"✗ {cell.name}/{broken.id}: INFRA ({broken.reason})", highlight=False, markup=False)
            dispatch = _Dispatch(opts, run_id, out, workers, writer, records, console, progress, task)
            try:
                for cell_name, items in by_cell.items():
                    cell = items[0].cell
                    if opts.jobs == 1:
                        # One item at a time: nothing else runs while an environment is built.
                        dispatch.drain()
                    progress.update(task, description=f"{cell_name}: environment")
                    env: Environment | None = None
                    reason = ""
                    try:
                        env = environment_for(cell, builder, cache_dir)
                        console.print(f"{cell_name}: environment {env.key} {_how(env)}", highlight=False)
                    except EnvironmentUnavailable as exc:
                        reason = exc.reason
                        console.print(f"{cell_name}: environment unavailable\n{reason}", highlight=False, markup=False)
                    meta["cells"][cell_name] = _cell_meta(cell, env, reason)
                    _write_run_json(out, meta)
                    dispatch.submit(items, env, reason)
                dispatch.drain()
            except BaseException:
                dispatch.abort()
                raise
            finally:
                meta["concurrency"] = dispatch.concurrency()
    except KeyboardInterrupt:
        interrupted = "SIGINT"
    except RunInterrupted as exc:
        interrupted = str(exc)
    finally:
        if workers is not None:
            workers.close()
            _record_workers(meta, workers)
        signal.signal(signal.SIGTERM, previous_term)
        signal.signal(signal.SIGINT, previous_int)

    meta["finished_at"] = _now()
    if interrupted:
        meta["interrupted"] = interrupted
    _write_run_json(out, meta)
    write_junit(out / JUNIT_FILE, run_id, records, plan.excluded)
    print_summary(console, records, plan.excluded)
    console.print(f"results: {out / RESULTS_FILE}", highlight=False)
    console.print(f"report: {write_report(out)}", highlight=False, markup=False)
    # The orchestrator's own high-water mark, the report included (the ranks are not in it).
    meta["orchestrator_peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    _write_run_json(out, meta)
    if interrupted:
        left = len(plan.items) + len(plan.broken) - len(records)
        console.print(
            f"interrupted by {interrupted}: {left} items not run; resume with: "
            f"{shlex.join(['python', '-m', 'harness', 'run', '--resume', str(out)])}",
            highlight=False,
        )
        return 130
    return 0 if records and all(r["matched"] for r in records) else 1
