"""Command line: ``python -m harness run|merge|bisect|compare|report|list``.

Exit status: 0 when every observation matched its expectation, 1 when any did
not, 2 for a usage or configuration error (one line naming the file, the field
and the fix; nothing is run).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from rich.console import Console

from harness.bisect import BisectOptions, execute_bisect
from harness.compare import NEW_REGRESSION, Thresholds, compare_runs, markdown
from harness.environments import default_cache_dir
from harness.errors import EXIT_USAGE, UserError
from harness.html_report import write_report
from harness.matrix import Matrix, load_matrix
from harness.merge import merge_runs
from harness.repro_registry import Discovery, discover
from harness.results import RESULTS_FILE, read_results
from harness.runner import LAUNCHERS, REPO_ROOT, RunOptions, default_launcher, execute, new_run_id
from harness.shard import parse_shard
from harness.summary import print_summary
from repros.common.spec import MODES

DEFAULT_MATRIX = REPO_ROOT / "matrix.yaml"


def _csv(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


def _jobs(value: str) -> int:
    try:
        jobs = int(value)
    except ValueError:
        jobs = -1
    if jobs < 0:
        raise argparse.ArgumentTypeError(f"--jobs takes a whole number of items (0: as many as fit), not {value!r}")
    return jobs


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m harness", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a lane (or chosen cells) of the matrix")
    run.add_argument("--matrix", type=Path, default=DEFAULT_MATRIX, help="matrix file (default: %(default)s)")
    run.add_argument("--lane", help="run the cells of this lane (default: the matrix's default_lane)")
    run.add_argument("--cells", type=_csv, default=(), help="comma-separated cell names")
    run.add_argument("--repros", type=_csv, default=(), help="comma-separated repro ids, e.g. F1,F5")
    run.add_argument("--modes", type=_csv, default=MODES, help=f"comma-separated modes (default: {','.join(MODES)})")
    run.add_argument("--out", type=Path, help="output directory (default: reports/<run-id>)")
    run.add_argument(
        "--resume",
        type=Path,
        metavar="DIR",
        help="finish an interrupted run: plan it as it was and run only the items DIR has no record of",
    )
    run.add_argument("--reports-dir", type=Path, default=Path("reports"), help="where run directories go")
    run.add_argument("--cache-dir", type=Path, help=f"environment cache (default: {default_cache_dir()})")
    run.add_argument(
        "--pin",
        action="append",
        default=[],
        metavar="PKG==VER",
        help="pin a package over the selected cells' own spec (repeatable)",
    )
    run.add_argument(
        "--launcher",
        choices=LAUNCHERS,
        default=default_launcher(),
        help="worker: fork each item's ranks from the cell's pre-imported worker (default); "
        "torchrun: a bare torchrun per item",
    )
    run.add_argument(
        "--jobs",
        type=_jobs,
        default=1,
        metavar="N",
        help="run up to N items at once where the cores, memory and GPUs allow it (default 1; 0: as many as fit)",
    )
    run.add_argument(
        "--shard",
        metavar="I/N",
        help="run only shard I of N of the planned items, balanced by the durations of the runs in --reports-dir",
    )

    merge = sub.add_parser("merge", help="combine the output directories of a sharded run into one run directory")
    merge.add_argument("out", type=Path, help="the merged run's directory (new)")
    merge.add_argument("shards", type=Path, nargs="+", metavar="SHARD_DIR", help="each shard's output directory")

    bisect = sub.add_parser("bisect", help="find the release of a package that changed a repro's outcome")
    bisect.add_argument("--repro", required=True)
    bisect.add_argument("--mode", default="bug")
    bisect.add_argument("--package", help="the package whose releases to bisect")
    bisect.add_argument("--good", required=True, help="a release (a date with --by-date) with the good outcome")
    bisect.add_argument("--bad", required=True, help="a release (a date with --by-date) with the bad outcome")
    bisect.add_argument(
        "--by-date",
        action="store_true",
        help="bisect over days: resolve the base cell's packages, unpinned, as of each day",
    )
    bisect.add_argument(
        "--hold",
        action="append",
        default=[],
        metavar="PKG",
        help="with --by-date: keep this package at the base cell's spec (repeatable; e.g. torch)",
    )
    bisect.add_argument("--matrix", type=Path, default=DEFAULT_MATRIX)
    bisect.add_argument("--cell", help="the base cell (default: the first cell of the default lane)")
    bisect.add_argument("--out", type=Path, help="output directory (default: reports/bisect-<run-id>)")
    bisect.add_argument("--reports-dir", type=Path, default=Path("reports"))
    bisect.add_argument("--cache-dir", type=Path, help=f"environment cache (default: {default_cache_dir()})")
    bisect.add_argument("--pre", action="store_true", help="include pre-releases")
    bisect.add_argument(
        "--verify",
        type=int,
        default=0,
        metavar="K",
        help="probe K more untested releases to catch a non-monotonic history",
    )

    bench = sub.add_parser(
        "bench", help="time items under bare torchrun and through the harness, interleaved, and what they cost"
    )
    bench.add_argument("--matrix", type=Path, default=DEFAULT_MATRIX, help="matrix file (default: %(default)s)")
    bench.add_argument("--lane", help="the lane whose items to time (default: the matrix's default_lane)")
    bench.add_argument("--cells", type=_csv, default=(), help="comma-separated cell names")
    bench.add_argument("--repros", type=_csv, default=(), help="comma-separated repro ids")
    bench.add_argument("--modes", type=_csv, default=MODES, help="comma-separated modes")
    bench.add_argument("--rounds", type=int, default=2, help="rounds of bare torchrun then harness (default 2)")
    bench.add_argument("--out", type=Path, help="output directory (default: reports/bench-<run-id>)")
    bench.add_argument("--cache-dir", type=Path, help=f"environment cache (default: {default_cache_dir()})")
    bench.add_argument("--no-cold", action="store_true", help="skip the cold environment build and the JIT timings")
    bench.add_argument("--no-jobs", action="store_true", help="skip the --jobs 0 harness run")

    compare = sub.add_parser("compare", help="classify what changed between two runs (markdown)")
    compare.add_argument("old", type=Path, help="the earlier run's directory")
    compare.add_argument("new", type=Path, help="the later run's directory")
    compare.add_argument("--markdown", type=Path, help="also write the markdown to this file")
    compare.add_argument(
        "--relative",
        type=float,
        default=Thresholds.relative,
        help="relative change flagged in memory and step time (default: %(default)s)",
    )
    compare.add_argument(
        "--memory-floor-mib",
        type=float,
        default=Thresholds.memory_floor_bytes / 2**20,
        help="smallest memory change flagged, MiB (default: %(default)s)",
    )
    compare.add_argument(
        "--time-floor-ms",
        type=float,
        default=Thresholds.time_floor_s * 1000,
        help="smallest step-time change flagged, ms (default: %(default)s)",
    )

    report = sub.add_parser("report", help="print a run's summary again and write its HTML report DIR/index.html")
    report.add_argument("dir", type=Path)

    listing = sub.add_parser("list", help="list the repros and the matrix's cells and lanes")
    listing.add_argument("--matrix", type=Path, default=DEFAULT_MATRIX)
    for command in (run, bisect, listing):
        command.add_argument(
            "--repros-dir",
            type=Path,
            action="append",
            default=[],
            metavar="DIR",
            help="also load the repro files (*.py) in DIR (repeatable; also $FT_REGRESS_REPROS)",
        )
    return parser


def _load(path: Path, repros_dirs: Sequence[Path] = ()) -> tuple[Matrix, Discovery]:
    for directory in repros_dirs:
        if not directory.is_dir():
            raise UserError(directory, "--repros-dir", "is not a directory", "pass a directory of repro .py files")
    discovery = discover(repros_dirs)
    return load_matrix(path, known_repros=discovery.repros.keys(), known_modes=MODES), discovery


def _pins(texts: Sequence[str]) -> tuple[tuple[str, str], ...]:
    pins = []
    for text in texts:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            raise UserError("--pin", text, "is not a requirement", "write it like deepspeed==0.19.5") from None
        if req.marker or req.extras or req.url or not str(req.specifier):
            raise UserError("--pin", text, "must be a name and a version specifier only", "write it like peft==0.21.2")
        pins.append((canonicalize_name(req.name), str(req.specifier)))
    return tuple(pins)


def _cache_dir(args: argparse.Namespace) -> Path:
    return Path(args.cache_dir or default_cache_dir()).expanduser().resolve()


def _bisect(args: argparse.Namespace, console: Console) -> int:
    matrix, discovery = _load(args.matrix, args.repros_dir)
    opts = BisectOptions(
        matrix=matrix,
        discovery=discovery,
        repro=args.repro,
        mode=args.mode,
        package=canonicalize_name(args.package) if args.package else None,
        by_date=args.by_date,
        hold=tuple(canonicalize_name(h) for h in args.hold),
        good=args.good,
        bad=args.bad,
        cache_dir=_cache_dir(args),
        cell=args.cell,
        out_dir=args.out,
        reports_dir=args.reports_dir,
        pre=args.pre,
        verify=args.verify,
    )
    return execute_bisect(opts, console)


def _resume(args: argparse.Namespace, console: Console, argv: Sequence[str]) -> int:
    run_json = args.resume / "run.json"
    if not run_json.exists():
        raise UserError(args.resume, "run.json", "is not a run directory", "pass the directory of an earlier run")
    chosen = [
        flag
        for flag, value in (
            ("--lane", args.lane),
            ("--cells", args.cells),
            ("--repros", args.repros),
            ("--out", args.out),
            ("--pin", args.pin),
            ("--shard", args.shard),
        )
        if value
    ]
    if chosen:
        raise UserError("--resume", chosen[0], "cannot be combined with --resume", "the run's own selection is reused")
    stored = json.loads(run_json.read_text()).get("options")
    if not stored:
        raise UserError(run_json, "options", "records no options to resume with", "start a new run instead")
    repros_dirs = [Path(d) for d in stored["repros_dirs"]]
    shard_meta = json.loads(run_json.read_text()).get("shard") or {}
    matrix, discovery = _load(Path(stored["matrix"]), repros_dirs)
    cache = Path(stored["cache_dir"]) if stored["cache_dir"] else None
    opts = RunOptions(
        matrix=matrix,
        discovery=discovery,
        lane=stored["lane"],
        cells=tuple(stored["cells"]),
        repros=tuple(stored["repros"]),
        modes=tuple(stored["modes"]),
        out_dir=args.resume,
        cache_dir=(cache or default_cache_dir()).resolve(),
        cache_dir_given=cache is not None,
        pins=tuple((name, spec) for name, spec in stored["pins"]),
        repros_dirs=tuple(repros_dirs),
        shard=parse_shard(stored["shard"]) if stored.get("shard") else None,
        shard_items=tuple(shard_meta["items"]) if shard_meta else None,
        launcher=args.launcher,
        jobs=args.jobs,
    )
    return execute(opts, console, argv, resume=args.resume)


def _run(args: argparse.Namespace, console: Console, argv: Sequence[str]) -> int:
    if args.resume:
        return _resume(args, console, argv)
    shard = parse_shard(args.shard) if args.shard is not None else None
    matrix, discovery = _load(args.matrix, args.repros_dir)
    opts = _selected(
        args,
        matrix,
        discovery,
        out_dir=args.out,
        reports_dir=args.reports_dir,
        pins=_pins(args.pin),
        repros_dirs=tuple(d.resolve() for d in args.repros_dir),
        shard=shard,
        launcher=args.launcher,
        jobs=args.jobs,
    )
    return execute(opts, console, argv)


def _selected(args: argparse.Namespace, matrix: Matrix, discovery: Discovery, **more: Any) -> RunOptions:
    """The run options of a command that selects items like ``run`` (lane, cells, repros, modes)."""
    return RunOptions(
        matrix=matrix,
        discovery=discovery,
        lane=args.lane,
        cells=args.cells,
        repros=args.repros,
        modes=args.modes,
        cache_dir=_cache_dir(args),
        cache_dir_given=args.cache_dir is not None,
        **more,
    )


def _bench(args: argparse.Namespace, console: Console) -> int:
    from harness.bench import BenchOptions, run_bench

    if args.rounds < 1:
        raise UserError("command line", "--rounds", f"{args.rounds} runs nothing", "pass --rounds 2 for A B A B")
    matrix, discovery = _load(args.matrix)
    opts = _selected(args, matrix, discovery)
    out = args.out or Path("reports") / f"bench-{new_run_id()}"
    bench = BenchOptions(run=opts, rounds=args.rounds, out=out.resolve(), cold=not args.no_cold, jobs_probe=not args.no_jobs)
    return run_bench(bench, console)


def _merge(args: argparse.Namespace, console: Console) -> int:
    merged = merge_runs(args.out, args.shards)
    print_summary(console, merged.records, merged.meta["excluded"])
    for warning in merged.warnings:
        console.print(f"warning: {warning}", highlight=False, markup=False)
    console.print(f"merged {len(args.shards)} shards, {len(merged.records)} records → {args.out}", highlight=False)
    try:  # the HTML report, where this checkout has the renderer
        from harness.html_report import write_report
    except ImportError:
        return 0
    console.print(f"report: {write_report(args.out)}", highlight=False, markup=False)
    return 0


def _run_records(directory: Path) -> list[dict]:
    path = directory / RESULTS_FILE
    if not path.exists():
        raise UserError(
            directory, RESULTS_FILE, "no results file here", "pass the directory of a run (reports/<run-id>)"
        )
    return read_results(path)


def _compare(args: argparse.Namespace) -> int:
    limits = Thresholds(
        relative=args.relative,
        memory_floor_bytes=int(args.memory_floor_mib * 2**20),
        time_floor_s=args.time_floor_ms / 1000,
    )
    changes = compare_runs(_run_records(args.old), _run_records(args.new), limits)
    text = markdown(changes, args.old.name, args.new.name)
    print(text)
    if args.markdown:
        args.markdown.write_text(text)
    return 1 if any(c.kind == NEW_REGRESSION for c in changes) else 0


def _report(args: argparse.Namespace, console: Console) -> int:
    path = args.dir / RESULTS_FILE
    if not path.exists():
        raise UserError(
            args.dir, RESULTS_FILE, "no results file here", "pass the directory of a run (reports/<run-id>)"
        )
    records = read_results(path)
    run_json = args.dir / "run.json"
    meta = json.loads(run_json.read_text()) if run_json.exists() else {}
    print_summary(console, records, meta.get("excluded") or [])
    console.print(f"report: {write_report(args.dir)}", highlight=False, markup=False)
    return 0 if records and all(r.get("matched") for r in records) else 1


def _list(args: argparse.Namespace, console: Console) -> int:
    matrix, discovery = _load(args.matrix, args.repros_dir)
    for repro in discovery.repros.values():
        console.print(
            f"[bold]{repro.id}[/bold] {repro.spec.title} ({repro.module}; modes {', '.join(repro.spec.modes)})",
            highlight=False,
        )
    for stem, broken in discovery.broken.items():
        console.print(f"broken: {stem} ({broken.module}): {broken.reason}", highlight=False, markup=False)
    for lane, description in matrix.lanes.items():
        cells = ", ".join(c.name for c in matrix.cells.values() if lane in c.lanes)
        console.print(f"lane [bold]{lane}[/bold]{': ' + description if description else ''} — {cells}", highlight=False)
    for cell in matrix.cells.values():
        pins = "passthrough" if cell.passthrough else " ".join(f"{k}{v}" for k, v in cell.packages.items())
        console.print(f"cell [bold]{cell.name}[/bold] (world size {cell.world_size}): {pins}", highlight=False)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    # In a CI log (not a terminal) rich would wrap at 80 columns: give tables room and
    # never break a printed line, so messages and commands stay whole and greppable.
    console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 160)
    try:
        if args.command == "run":
            return _run(args, console, argv)
        if args.command == "report":
            return _report(args, console)
        if args.command == "bisect":
            return _bisect(args, console)
        if args.command == "compare":
            return _compare(args)
        if args.command == "bench":
            return _bench(args, console)
        if args.command == "merge":
            return _merge(args, console)
        return _list(args, console)
    except UserError as exc:
        print(f"error: {exc.line()}", file=sys.stderr)
        return EXIT_USAGE
