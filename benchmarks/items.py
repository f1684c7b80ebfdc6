"""``python -m harness bench``: what the harness costs against bare torchrun, in one run.

For the selected items (default: the default lane), interleaved A B A B ...:

* **A, bare**: each item's ranks under a plain ``torchrun --standalone`` of the same
  script (``repros.runtime.rank_main``) in the same environment, one after another, timed
  from the start of torchrun to its exit; the ranks' records are then classified
  exactly as the harness classifies them, so the outcomes can be compared;
* **B, harness**: ``python -m harness run`` over the same items, timed end to end (the
  environments' lookup, the cells' workers starting, every item, the report).

Then it prints per-item medians (bare wall against the harness's per-item wall), the
lane's totals and their ratio, whether every item had the same outcome and signature in
every A and B, the fixed trainer's step time run to run, the environments (a cached cell
ready; a cold build into a scratch cache, and a second environment of the same torch and
deepspeed), the orchestrator's own peak RSS, and ``--jobs``: measured on this machine, and
how many items would run at once on a reference GPU box. ``bench.json`` keeps it all.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from harness.core.json import JsonValue
from harness.environments import Environment, Environments, EnvRequest, UvEnvironments
from harness.execution.classify import classify
from harness.execution.launchers import LauncherContext, LaunchRequest, make_launcher
from harness.execution.metrics import slowest_rank_per_step
from harness.execution.scheduler import Demand, Machine, items_at_once
from harness.planning.items import PlannedItem, RunOptions, plan_items
from harness.records.item import ItemRecord
from harness.records.run_dir import RunDir
from harness.reports.run_cost import RunCost
from repros.runtime.spec import ReproSpec

#: The GPU box ``--jobs`` is projected onto (a common 8-GPU node).
REFERENCE_GPU_BOX = Machine(cpus=96, memory_bytes=1024 * 2**30, gpus=tuple(str(i) for i in range(8)))


@dataclass(frozen=True)
class BenchOptions:
    run: RunOptions
    rounds: int = 2
    out: Path = Path("reports/bench")
    cold: bool = True
    jobs_probe: bool = True
    #: Only a fresh clone's ``make run``: the cold run and the warm run after it (``cold_start``).
    cold_start_only: bool = False
    #: Time bare torchrun too (False: only the harness rounds, their figures per device; what a lent GPU's
    #: minutes allow, where a bare torchrun of each item costs half a minute).
    bare: bool = True


def _median(values: Iterable[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _fmt(value: float | None, unit: str = "s", digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f} {unit}".rstrip()


# -- A: bare torchrun ------------------------------------------------------------------------
@dataclass(frozen=True)
class BareRun:
    """One item under a bare torchrun: its wall, outcome and step times."""

    wall_s: float
    outcome: str
    signature: str | None
    step_s: float | None
    step_cpu_s: float | None


@dataclass(frozen=True)
class HarnessRun:
    """``run`` over the items, end to end."""

    wall_s: float
    records: dict[tuple[str, str, str], ItemRecord]
    orchestrator_peak_rss_bytes: int | None
    worker_start_s: dict[str, JsonValue]
    concurrency: dict[str, JsonValue] | None


def _median_of(record: ItemRecord, measure: str) -> float | None:
    figure = record.figure(measure)
    return figure.steps.median if figure is not None and figure.steps is not None else None


def bare_torchrun(env: Environment, item: PlannedItem, spec: ReproSpec, item_dir: Path) -> BareRun:
    """One item under a plain torchrun (the registered torchrun launcher, timed from start to
    exit): its wall, and its outcome as the harness classifies it."""
    launch = make_launcher("torchrun", LauncherContext(log_dir=item_dir.parent)).launch(
        LaunchRequest(
            env=env,
            module=item.module,
            mode=item.mode,
            world_size=item.world_size,
            item_dir=item_dir,
            timeout_s=item.cell.timeout_s,
            cell=item.cell.name,
            params=item.launch_params(),
        )
    )
    observation = classify(item.mode, spec, launch)
    # The step times exactly as a harness record gives them (metrics), so A and B compare.
    ranks = [rec for rec in launch.records.values() if rec]
    steps = slowest_rank_per_step(ranks, "step_time")
    cpu = slowest_rank_per_step(ranks, "step_cpu_time")
    return BareRun(
        wall_s=launch.wall_s,
        outcome=observation.outcome,
        signature=observation.signature,
        step_s=steps.median if steps else None,
        step_cpu_s=cpu.median if cpu else None,
    )


# -- B: the harness --------------------------------------------------------------------------
def harness_run(opts: RunOptions, items: Sequence[PlannedItem], out: Path, jobs: int = 1) -> HarnessRun:
    # In the plan's order: the run plans (and orders its environments) as ``make run`` would.
    cells = list(dict.fromkeys(i.cell.name for i in items))
    repros = list(dict.fromkeys(i.repro_id for i in items))
    modes = list(dict.fromkeys(i.mode for i in items))
    command = [sys.executable, "-m", "harness", "run", "--matrix", str(opts.matrix.path), "--out", str(out)]
    command += ["--cells", ",".join(cells), "--repros", ",".join(repros), "--modes", ",".join(modes)]
    command += ["--jobs", str(jobs), "--launcher", "worker"]
    command += opts.stack.evolve(pins=(), families=(), as_of=None).flags() + opts.cache.flags()
    started = time.perf_counter()
    proc = subprocess.run(command, cwd=Path.cwd(), capture_output=True, text=True, check=False)
    wall_s = time.perf_counter() - started
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"harness run failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    run_dir = RunDir(out)
    meta = run_dir.read_meta()
    workers = {name: c.worker or {} for name, c in meta.cells.items()}
    return HarnessRun(
        wall_s=wall_s,
        records={r.key: r for r in run_dir.records()},
        orchestrator_peak_rss_bytes=meta.orchestrator_peak_rss_bytes,
        worker_start_s={name: w.get("start_s") for name, w in workers.items()},
        concurrency=meta.concurrency,
    )


def per_device(runs: Sequence[HarnessRun]) -> dict[str, dict[str, Any]]:
    """By the device the ranks ran on (``cuda (NVIDIA H200)``, ``cpu``): items, the median seconds from an
    item's launch to its first training step and outside its training (its wall less the span from the
    first step to the last), and items per minute over the harness rounds' walls."""
    found: dict[str, dict[str, list[float]]] = {}
    walls: dict[str, float] = {}
    for run in runs:
        share = run.wall_s / max(1, len(run.records))
        for record in run.records.values():
            device = record.device or "none"
            if record.device_name:
                device += f" ({record.device_name})"
            seen = found.setdefault(device, {"to_training_s": [], "outside_training_s": [], "items": []})
            seen["items"].append(1.0)
            walls[device] = walls.get(device, 0.0) + share
            if record.to_training_s is not None:
                seen["to_training_s"].append(record.to_training_s)
            if record.training_s is not None:
                seen["outside_training_s"].append(max(0.0, record.wall_s - record.training_s))
    return {
        device: {
            "items": len(seen["items"]),
            "to_training_median_s": _median(seen["to_training_s"]),
            "outside_training_median_s": _median(seen["outside_training_s"]),
            "trained_items": len(seen["outside_training_s"]),
            "items_per_minute": 60 * len(seen["items"]) / walls[device] if walls.get(device) else None,
        }
        for device, seen in found.items()
    }


# -- where a run's time goes ---------------------------------------------------------------
def _stamp(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return dt.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def time_outside_items(run_dir: Path, wall_s: float | None = None) -> dict[str, Any]:
    """A run's wall (``wall_s``, the process's, else ``run.json``'s start to finish) less the sum of
    its items' own walls, and where that time went, from ``run.json`` and the records' times (whole
    seconds: each part is within a second or so a gap): before the first item (planning, the first
    cell's environment), inside an item's span but outside its wall (the check of its environment
    after it, classifying, what the launcher does after the ranks end), between one item's end and
    the next one's start, split where the cell changes (its environment made ready, the previous
    worker closed) and where it does not (the record written, the environment checked before the
    item), after the last item (reports), and the process's start and exit around ``run.json``'s
    times. Workers start inside their cell's first item's span: their seconds are given apart."""
    run = RunDir(run_dir)
    meta = run.read_meta()
    records = sorted(
        (r for r in run.records() if _stamp(r.started_at) is not None and _stamp(r.finished_at) is not None),
        key=lambda r: (_stamp(r.started_at), _stamp(r.finished_at)),
    )
    start, end = _stamp(meta.started_at), _stamp(meta.finished_at)
    items_s = sum(r.wall_s for r in records)
    span_s = (end - start) if start is not None and end is not None else None
    total = wall_s if wall_s is not None else span_s
    result: dict[str, Any] = {
        "items": len(records),
        "run_wall_s": total,
        "items_wall_s": items_s,
        "outside_items_s": None if total is None else total - items_s,
    }
    if not records or start is None or end is None or total is None:
        return result
    spans = [(_stamp(r.started_at) or 0.0, _stamp(r.finished_at) or 0.0) for r in records]
    same_cell = cell_change = 0.0
    for n in range(1, len(records)):
        gap = max(0.0, spans[n][0] - spans[n - 1][1])
        if records[n].cell == records[n - 1].cell:
            same_cell += gap
        else:
            cell_change += gap
    workers = {name: (cell.worker or {}).get("start_s") for name, cell in meta.cells.items()}
    built = {name: cell.build_s for name, cell in meta.cells.items() if cell.build_s}
    split = {
        "before_first_item_s": max(0.0, spans[0][0] - start),
        "in_item_spans_outside_walls_s": sum(
            max(0.0, (b - a) - r.wall_s) for r, (a, b) in zip(records, spans, strict=True)
        ),
        "of_which_worker_starts_s": sum(v for v in workers.values() if isinstance(v, (int, float))),
        "between_items_same_cell_s": same_cell,
        "between_items_cell_change_s": cell_change,
        "after_last_item_s": max(0.0, end - max(b for _, b in spans)),
        "process_start_and_exit_s": (total - span_s) if wall_s is not None and span_s is not None else None,
        "environments_built_s": sum(built.values()),
    }
    result["split"] = split
    result["per_item_outside_s"] = (total - items_s) / len(records)
    result["cells"] = len(meta.cells)
    return result


def _deepspeed_step(cache: Path, key: str | None) -> JsonValue:
    """How an environment in ``cache`` got DeepSpeed (its ``env.json``)."""
    try:
        written: JsonValue = json.loads((cache / "envs" / str(key) / "env.json").read_text())
    except (OSError, ValueError):
        return None
    return written.get("deepspeed_ops") if isinstance(written, Mapping) else None


def _seconds_after(stamp: str | None, origin: float) -> float | None:
    at = _stamp(stamp)
    return None if at is None else at - origin


def _build_steps(cache: Path, keys: Iterable[str | None]) -> dict[str, float]:
    """The build steps of the environments ``keys`` (their ``env.json``), summed."""
    total: dict[str, float] = {}
    for key in keys:
        try:
            steps = json.loads((cache / "envs" / str(key) / "env.json").read_text()).get("build_steps") or {}
        except (OSError, ValueError, AttributeError):
            continue
        for step, seconds in steps.items():
            if isinstance(seconds, (int, float)):
                total[step] = total.get(step, 0.0) + seconds
    return total


def run_split(opts: RunOptions, items: Sequence[PlannedItem], out: Path, cache: Path) -> dict[str, Any]:
    """``run`` over ``items`` with the environment cache ``cache``, as ``make run`` runs it, and where
    its wall went: the first record (seconds from the process's start), the items' own walls, the
    environments (the time no item ran because none had its environment yet; the builds themselves
    overlap the items of cells already ready), and the rest (workers starting, checks, records,
    reports, the process's start and exit)."""
    before = os.getloadavg()
    launched = time.time()
    run = harness_run(replace(opts, cache=opts.cache.evolve(cache_dir=cache, resolved=cache)), items, out)
    outside = time_outside_items(out, run.wall_s)
    meta = RunDir(out).read_meta()
    records = list(RunDir(out).records())
    stage = meta.environment_stage or {}
    waited_s = stage.get("waited_s")
    waited = float(waited_s) if isinstance(waited_s, (int, float)) else 0.0
    items_s = outside["items_wall_s"]
    built = {name: c.build_s for name, c in meta.cells.items() if c.build_s}
    return {
        "wall_s": run.wall_s,
        "items": len(records),
        "matched": sum(1 for r in records if r.matched),
        "first_record_s": _seconds_after(meta.first_record_at, launched),
        "environments_s": waited,
        "items_s": items_s,
        "rest_s": run.wall_s - waited - items_s,
        "outside_items_share": (run.wall_s - items_s) / run.wall_s if run.wall_s else None,
        "environments_built": len(built),
        "builds_s": sum(built.values()),
        "build_s_by_cell": built,
        "build_steps_s": _build_steps(cache, (c.key for c in meta.cells.values() if c.build_s)),
        "stage": stage,
        "deepspeed_by_cell": {name: _deepspeed_step(cache, c.key) for name, c in meta.cells.items() if c.build_s},
        "worker_start_s": sum(v for v in run.worker_start_s.values() if isinstance(v, (int, float))),
        "outside_items": outside,
        "load_average": {"before": list(before), "after": list(os.getloadavg())},
        # What the run itself said it cost, and its floor (``harness/reports/run_cost.py``).
        "cost": (meta.model_extra or {}).get("cost"),
    }


def cold_start(opts: RunOptions, items: Sequence[PlannedItem], scratch: Path, out: Path) -> dict[str, Any]:
    """A fresh clone's ``make run``: the items into an empty environment cache (uv's own cache as it
    is), then the same run again with every environment built."""
    cold = run_split(opts, items, out / "harness-cold", scratch)
    warm = run_split(opts, items, out / "harness-warm", scratch)
    return {"cold": cold, "warm": warm}


# -- environments --------------------------------------------------------------------
def warm_environment_times(opts: RunOptions, items: Sequence[PlannedItem]) -> dict[str, float]:
    """Seconds for a cached cell's environment to be ready, as a new run finds it."""
    cache = opts.cache_dir
    assert cache is not None
    times: dict[str, float] = {}
    for cell in {i.cell.name: i.cell for i in items}.values():
        started = time.perf_counter()
        Environments(cache).for_cell(cell)
        times[cell.name] = time.perf_counter() - started
    return times


def cold_environments(opts: RunOptions, cell_item: PlannedItem, scratch: Path) -> dict[str, Any]:
    """A cold build of one cell into a scratch cache (uv's own cache as it is), then a second
    environment with the same torch and deepspeed."""
    index = Environments(scratch).index
    builder = UvEnvironments(scratch, index)
    cell = cell_item.cell
    request = EnvRequest(
        packages=cell.packages,
        python=cell.python,
        exclude_newer=cell.exclude_newer,
        exclude_packages=cell.exclude_packages,
    )
    started = time.perf_counter()
    env = builder.get(request)
    cold_s = time.perf_counter() - started
    started = time.perf_counter()
    UvEnvironments(scratch, index).get(request)
    warm_s = time.perf_counter() - started
    # Another environment with the same (torch, deepspeed) pair: a different key, same stack.
    sibling_request = replace(request, exclude_newer="2999-01-01")
    started = time.perf_counter()
    sibling = builder.get(sibling_request)
    sibling_s = time.perf_counter() - started
    return {
        "cell": cell.name,
        "cold_build_s": cold_s,
        "deepspeed_step": env.deepspeed_ops,
        "warm_ready_s": warm_s,
        "same_pair_build_s": sibling_s,
        "same_pair_deepspeed_step": sibling.deepspeed_ops,
    }


def jit_ops_present(envs: Iterable[Environment]) -> dict[str, list[str]]:
    """Which JIT-built ops each environment's extensions directory holds (none expected)."""
    found = {}
    for env in envs:
        directory = Path(env.extensions_dir)
        found[env.key] = sorted(p.name for p in directory.iterdir() if p.is_dir()) if directory.exists() else []
    return found


# -- the whole benchmark ---------------------------------------------------------------------
def run_cold_start_bench(bench: BenchOptions, items: Sequence[PlannedItem], console: Console) -> int:
    """Only the cold start: the selection into an empty environment cache, then again warm."""
    console.print(f"bench: a cold run and a warm run of {len(items)} items → {bench.out}")
    scratch = Path(tempfile.mkdtemp(prefix="cold-run-", dir=bench.out))
    try:
        measured = cold_start(bench.run, items, scratch, bench.out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result = {"items": [i.id.label() for i in items], "cold_start": measured}
    (bench.out / "bench.json").write_text(json.dumps(result, indent=1, default=str))
    print_cold_start(console, measured)
    cold = measured["cold"]
    return 0 if cold["matched"] == cold["items"] else 1


def run_bench(bench: BenchOptions, console: Console) -> int:
    opts = bench.run
    plan = plan_items(opts)
    items = plan.items
    if not items:
        console.print("nothing to benchmark: the selection plans no items")
        return 2
    out = bench.out
    out.mkdir(parents=True, exist_ok=True)
    if bench.cold_start_only:
        return run_cold_start_bench(bench, items, console)
    what = "bare torchrun and harness" if bench.bare else "the harness (no bare torchrun)"
    console.print(f"bench: {len(items)} items, {bench.rounds} rounds of {what} → {out}")
    assert opts.cache_dir is not None
    environments = Environments(opts.cache_dir)
    envs: dict[str, Environment] = {}
    for cell in {i.cell.name: i.cell for i in items}.values():
        resolved = environments.for_cell(cell)
        if resolved.env is None:
            console.print(f"{cell.name}: environment unavailable, its items are left out: {resolved.reason}")
        else:
            envs[cell.name] = resolved.env
    items = [i for i in items if i.cell.name in envs]
    result: dict[str, Any] = {"items": [i.id.label() for i in items], "rounds": bench.rounds}
    result["warm_env_ready_s"] = warm_environment_times(opts, items)

    bare: dict[str, list[BareRun]] = {i.id.label(): [] for i in items}
    harness: list[HarnessRun] = []
    for round_no in range(1, bench.rounds + 1):
        started = time.perf_counter()
        for item in items if bench.bare else ():
            item_dir = out / f"bare-{round_no}" / item.cell.name / f"{item.repro_id}-{item.mode}"
            spec = opts.discovery.repros[item.repro_id].spec
            bare[item.id.label()].append(bare_torchrun(envs[item.cell.name], item, spec, item_dir))
        if bench.bare:
            console.print(f"round {round_no}: bare torchrun {time.perf_counter() - started:.1f} s")
        run = harness_run(opts, items, out / f"harness-{round_no}")
        harness.append(run)
        console.print(f"round {round_no}: harness {run.wall_s:.1f} s")
    if not bench.bare:
        result.update(
            harness_totals_s=[h.wall_s for h in harness],
            per_device=per_device(harness),
            worker_start_s=[h.worker_start_s for h in harness],
            outside_items=[time_outside_items(out / f"harness-{n}", h.wall_s) for n, h in enumerate(harness, 1)],
        )
        (out / "bench.json").write_text(json.dumps(result, indent=1, default=str))
        print_per_device(console, result)
        print_outside_items(console, result["outside_items"])
        return 0

    per_item = []
    identical = True
    for item in items:
        key = (item.cell.name, item.repro_id, item.mode)
        label = item.id.label()
        seen_bare = {(b.outcome, b.signature) for b in bare[label]}
        seen_harness = {(str(h.records[key].outcome), h.records[key].signature) for h in harness}
        runs = [
            {"run": f"bare-{n}", "outcome": b.outcome, "signature": b.signature} for n, b in enumerate(bare[label], 1)
        ]
        runs += [
            {"run": f"harness-{n}", "outcome": h.records[key].outcome, "signature": h.records[key].signature}
            for n, h in enumerate(harness, 1)
        ]
        same = len(seen_bare | seen_harness) == 1
        identical &= same
        per_item.append(
            {
                "item": label,
                "bare_s": _median(b.wall_s for b in bare[label]),
                "harness_s": _median(h.records[key].wall_s for h in harness),
                "outcomes": sorted({o for o, _ in seen_bare | seen_harness}),
                "identical": same,
                "runs": runs,
                "step_s_bare": [b.step_s for b in bare[label]],
                "step_s_harness": [_median_of(h.records[key], "step_time") for h in harness],
                "step_cpu_s_bare": [b.step_cpu_s for b in bare[label]],
                "step_cpu_s_harness": [_median_of(h.records[key], "step_cpu_time") for h in harness],
            }
        )
    bare_totals = [sum(bare[i.id.label()][r].wall_s for i in items) for r in range(bench.rounds)]
    harness_totals = [h.wall_s for h in harness]
    result.update(
        per_item=per_item,
        bare_totals_s=bare_totals,
        harness_totals_s=harness_totals,
        ratio=statistics.median(harness_totals) / statistics.median(bare_totals),
        identical_outcomes=identical,
        orchestrator_peak_rss_bytes=[h.orchestrator_peak_rss_bytes for h in harness],
        worker_start_s=[h.worker_start_s for h in harness],
        jit_ops_in_environments=jit_ops_present(envs.values()),
        outside_items=[time_outside_items(out / f"harness-{n}", h.wall_s) for n, h in enumerate(harness, 1)],
        per_device=per_device(harness),
    )
    result["step_time_spread"] = step_time_spread(per_item)
    result["step_cpu_time_spread"] = step_time_spread(per_item, "step_cpu_s")
    result["model"] = opts.stack.model or "each cell's own"

    machine = Machine.detect()
    demand = Demand.for_item(max(i.world_size for i in items), machine)
    gpu_demand = Demand.for_item(max(i.world_size for i in items), REFERENCE_GPU_BOX)
    result["jobs"] = {
        "machine": machine.describe(),
        "items_at_once_here": items_at_once(machine, demand, 0),
        "reference_gpu_box": REFERENCE_GPU_BOX.describe(),
        "items_at_once_gpu_box": items_at_once(REFERENCE_GPU_BOX, gpu_demand, 0),
    }
    if bench.jobs_probe:
        run = harness_run(opts, items, out / "harness-jobs", jobs=0)
        result["jobs"].update(wall_s=run.wall_s, speedup=statistics.median(harness_totals) / run.wall_s)
        result["jobs"]["concurrency"] = run.concurrency
    if bench.cold:
        scratch = Path(tempfile.mkdtemp(prefix="cold-", dir=out))
        try:
            result["cold"] = cold_environments(opts, items[0], scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        scratch = Path(tempfile.mkdtemp(prefix="cold-run-", dir=out))
        try:
            result["cold_start"] = cold_start(opts, items, scratch, out)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    (out / "bench.json").write_text(json.dumps(result, indent=1, default=str))
    print_bench(console, result)
    return 0 if identical else 1


def step_time_spread(per_item: list[dict[str, Any]], figure: str = "step_s") -> dict[str, Any]:
    """The fixed trainer's median step time (``step_s``: wall; ``step_cpu_s``: process CPU time),
    run to run: each item's (max - min) / median."""
    rows = []
    for row in per_item:
        if not row["item"].endswith("/fixed"):
            continue
        values = [v for v in [*row.get(f"{figure}_bare", []), *row.get(f"{figure}_harness", [])] if v]
        if len(values) >= 2:
            mid = statistics.median(values)
            rows.append({"item": row["item"], "median_s": mid, "spread": (max(values) - min(values)) / mid})
    spreads = [r["spread"] for r in rows]
    return {
        "items": rows,
        "median_spread": _median(spreads),
        "max_spread": max(spreads) if spreads else None,
    }


def print_bench(console: Console, result: dict[str, Any]) -> None:
    table = Table(title="per item: median wall over the rounds")
    for column in ("item", "bare torchrun", "harness", "harness/bare", "outcome", "same in all runs"):
        table.add_column(column)
    for row in result["per_item"]:
        ratio = row["harness_s"] / row["bare_s"] if row["bare_s"] and row["harness_s"] else None
        table.add_row(
            row["item"],
            _fmt(row["bare_s"]),
            _fmt(row["harness_s"]),
            _fmt(ratio, "", 2),
            ",".join(row["outcomes"]),
            "yes" if row["identical"] else "NO",
        )
    console.print(table)
    bare, harness = _median(result["bare_totals_s"]), _median(result["harness_totals_s"])
    console.print(
        f"lane total, median of {result['rounds']} rounds: bare torchrun {_fmt(bare)} "
        f"(rounds: {', '.join(_fmt(t) for t in result['bare_totals_s'])}), harness end to end {_fmt(harness)} "
        f"(rounds: {', '.join(_fmt(t) for t in result['harness_totals_s'])}); ratio harness/bare {result['ratio']:.3f}"
    )
    console.print(f"identical outcomes and signatures, bare and harness, every round: {result['identical_outcomes']}")
    for row in result["per_item"]:
        if not row["identical"]:
            seen = ", ".join(
                f"{r['run']} {r['outcome']}" + (f" ({r['signature']})" if r["signature"] else "") for r in row["runs"]
            )
            console.print(f"  differs: {row['item']}: {seen}", highlight=False)
    rss = [r for r in result["orchestrator_peak_rss_bytes"] if r]
    console.print(f"orchestrator peak RSS: {', '.join(f'{r / 2**20:.0f} MiB' for r in rss)}")
    starts = [s for run in result["worker_start_s"] for s in run.values() if s]
    console.print(f"cell workers ready (imports): median {_fmt(_median(starts))} over {len(starts)} starts")
    warm = result["warm_env_ready_s"]
    console.print(
        f"cached cell's environment ready: median {_fmt(_median(warm.values()), 's', 2)}, "
        f"max {_fmt(max(warm.values()), 's', 2)} over {len(warm)} cells"
    )
    console.print(f"JIT-built ops in the environments: {result['jit_ops_in_environments']}")
    for key, what in (("step_time_spread", "wall"), ("step_cpu_time_spread", "process CPU")):
        spread = result[key]
        console.print(
            f"fixed trainer's {what} time per step, run to run ((max-min)/median over {2 * result['rounds']} runs "
            f"each; model {result['model']}): median {_fmt((spread['median_spread'] or 0) * 100, '%', 1)}, "
            f"max {_fmt((spread['max_spread'] or 0) * 100, '%', 1)}"
        )
        for row in spread["items"]:
            console.print(f"  {row['item']}: {row['median_s'] * 1000:.0f} ms, spread {row['spread'] * 100:.1f}%")
    jobs = result["jobs"]
    line = f"--jobs: here ({jobs['machine']}) {jobs['items_at_once_here']} item(s) at once"
    if "wall_s" in jobs:
        line += f"; --jobs 0 took {_fmt(jobs['wall_s'])}, speedup {jobs['speedup']:.2f}x over --jobs 1"
    line += f"; on {jobs['reference_gpu_box']}: {jobs['items_at_once_gpu_box']} items at once"
    console.print(line)
    print_per_device(console, result)
    print_outside_items(console, result.get("outside_items") or [])
    print_cold_start(console, result.get("cold_start"))
    cold = result.get("cold")
    if cold:
        step = cold.get("deepspeed_step") or {}
        sibling = cold.get("same_pair_deepspeed_step") or {}
        console.print(
            f"environments ({cold['cell']}, scratch cache, uv's cache warm): cold build {_fmt(cold['cold_build_s'])} "
            f"(deepspeed: {_fmt(step.get('seconds'))}), then ready in {_fmt(cold['warm_ready_s'], 's', 2)}; a second "
            f"environment of the same torch and deepspeed: {_fmt(cold['same_pair_build_s'])} "
            f"(deepspeed: {_fmt(sibling.get('seconds'))})"
        )


def print_per_device(console: Console, result: dict[str, Any]) -> None:
    """Per device the ranks ran on: items per minute, and the medians from launch to the first step and
    outside the training per item."""
    for device, row in (result.get("per_device") or {}).items():
        console.print(
            f"on {device}: {row['items']} items, {_fmt(row['items_per_minute'], 'items/min')} end to end; "
            f"from launch to the first step median {_fmt(row['to_training_median_s'], 's', 2)}, outside the "
            f"training median {_fmt(row['outside_training_median_s'], 's', 2)} per item "
            f"({row['trained_items']} items trained)"
        )
    starts = [s for run in result.get("worker_start_s") or [] for s in run.values() if s]
    if starts:
        console.print(f"cell workers ready: median {_fmt(_median(starts))} over {len(starts)} starts")


def print_outside_items(console: Console, runs: list[dict[str, Any]]) -> None:
    """The harness rounds' time outside their items, and where it went (the median round's parts)."""
    rounds = [r for r in runs if r.get("outside_items_s") is not None]
    if not rounds:
        return
    middle = sorted(rounds, key=lambda r: r["outside_items_s"])[(len(rounds) - 1) // 2]
    console.print(
        f"time outside items: {', '.join(_fmt(r['outside_items_s']) for r in rounds)} "
        f"(run wall {', '.join(_fmt(r['run_wall_s']) for r in rounds)} less the items' own walls "
        f"{', '.join(_fmt(r['items_wall_s']) for r in rounds)}); {_fmt(middle['per_item_outside_s'], 's', 2)} "
        f"an item over {middle['items']} items in {middle.get('cells', '?')} cells"
    )
    labels = {
        "process_start_and_exit_s": "process start and exit",
        "before_first_item_s": "planning and the first environment",
        "of_which_worker_starts_s": "cell workers starting (inside their first items' spans)",
        "in_item_spans_outside_walls_s": "inside items' spans, outside their walls (workers included)",
        "between_items_same_cell_s": "between items of a cell",
        "between_items_cell_change_s": "between cells",
        "after_last_item_s": "after the last item (reports)",
    }
    split = middle.get("split") or {}
    parts = [f"{label} {_fmt(split.get(key))}" for key, label in labels.items() if split.get(key) is not None]
    console.print(f"  of the median round: {'; '.join(parts)}")


#: What a fresh clone's ``make run`` is held to (issue 51): every item within this, on a 2-core machine.
COLD_RUN_BAR_S = 420.0
#: ... and its first result within this.
FIRST_RECORD_BAR_S = 60.0
#: A warm run spends at most this share of its wall outside items.
WARM_OUTSIDE_BAR = 0.25


def print_cold_start(console: Console, result: dict[str, Any] | None) -> None:
    """The cold run and the warm run after it: total wall, first record, the split, against the bar."""
    if not result:
        return
    cold, warm = result["cold"], result["warm"]
    load = cold["load_average"]
    console.print(
        f"cold run (empty environment cache, uv's cache warm; load average {load['before'][0]:.1f} before, "
        f"{load['after'][0]:.1f} after): {cold['matched']} of {cold['items']} matched in {_fmt(cold['wall_s'])}, "
        f"the first record {_fmt(cold['first_record_s'])} after the start"
    )
    console.print(
        f"  = environments {_fmt(cold['environments_s'])} (no item could run yet) + items {_fmt(cold['items_s'])} "
        f"+ the rest {_fmt(cold['rest_s'])} (workers starting {_fmt(cold['worker_start_s'])}, checks, records, "
        f"reports, the process's start and exit)"
    )
    if isinstance(cold.get("cost"), dict):
        cost = RunCost(**{f.name: cold["cost"][f.name] for f in fields(RunCost)})
        for line in cost.lines():
            console.print(f"  {line}", highlight=False, markup=False)
    steps = ", ".join(f"{step} {_fmt(seconds)}" for step, seconds in sorted(cold["build_steps_s"].items()))
    stage = cold.get("stage") or {}
    console.print(
        f"  {cold['environments_built']} environments built in {_fmt(cold['builds_s'])} ({steps}), "
        f"{stage.get('builders', '?')} at a time, in the order {', '.join(stage.get('order', []))}"
    )
    for cell, step in sorted((cold.get("deepspeed_by_cell") or {}).items()):
        if step:
            why = f" ({str(step['why'])[:80]})" if step.get("why") else ""
            console.print(f"  {cell}: deepspeed {_fmt(step.get('seconds'))}{why}")
    share = warm["outside_items_share"]
    console.print(
        f"warm run (every environment built): {warm['matched']} of {warm['items']} matched in "
        f"{_fmt(warm['wall_s'])}, items {_fmt(warm['items_s'])}, outside them {_fmt(warm['wall_s'] - warm['items_s'])}"
        f" ({_fmt((share or 0) * 100, '%', 0)} of the wall), the first record {_fmt(warm['first_record_s'])}"
    )
    print_outside_items(console, [warm["outside_items"]])
    held = [
        ("every item matched", cold["matched"] == cold["items"]),
        (f"within {COLD_RUN_BAR_S:.0f} s", cold["wall_s"] <= COLD_RUN_BAR_S),
        (f"first record within {FIRST_RECORD_BAR_S:.0f} s", (cold["first_record_s"] or 1e9) <= FIRST_RECORD_BAR_S),
        (f"warm: at most {WARM_OUTSIDE_BAR:.0%} outside items", (share or 1.0) <= WARM_OUTSIDE_BAR),
    ]
    console.print("bar: " + "; ".join(f"{what}: {'yes' if ok else 'NO'}" for what, ok in held))
