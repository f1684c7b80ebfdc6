"""``atlas build`` and ``atlas check``: which documented failures a stack has, from proven boundaries.

``atlas build --out DIR [--from RUN_DIR ...]`` writes ``DIR/atlas.json`` and ``DIR/index.html`` from the catalog's
expectations and the runs, bisects, watch nights and atlases given (and ``DIR/issues/*.md``, one per release a
watch night named as a regression's culprit). ``atlas check (--stack "torch==2.5.1 ..." | --requirements FILE |
--here)`` prints one line per documented failure: its id, ``affected``, ``not affected`` or ``unknown``, and why;
it runs nothing unless ``--prove``, which builds the stack as a cell, runs what is unknown, and keeps what it saw
in the atlas (``--atlas DIR``, default ``<reports-dir>/atlas``).

Exit status (check): 1 when the stack has a documented failure, 0 when it has none proven, 2 when nothing was
answered (every failure asked about unknown); (build) 0; 2 for a usage error.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.console import Console

from harness.analysis.atlas.build import assemble, build_atlas, load_atlas, write_build
from harness.analysis.atlas.check import UNKNOWN, check_stack, exit_status, nothing_answered, where_of
from harness.analysis.atlas.evidence import read_sources
from harness.analysis.atlas.model import ATLAS_FILE
from harness.analysis.atlas.osv import write_osv
from harness.analysis.atlas.survey import SurveyStack, in_survey_order, load_survey, slice_of
from harness.analysis.atlas.survey_plan import runnable_on
from harness.cli import options
from harness.cli.commands.base import Command
from harness.config.model import DEFAULT_PYTHON
from harness.config.repros import Discovery, discover
from harness.core.errors import EXIT_USAGE, UserError
from harness.core.names import unknown_repro_fix
from harness.core.option import whole_number
from harness.environments import EnvironmentUnavailable
from harness.environments.index import pip_index_config
from harness.environments.stacks import (
    Stack,
    parse_stack_text,
    read_requirement_file,
    read_requirements,
    resolve_requirements,
    stack_here,
)
from harness.environments.uv import UvEnvironments
from harness.execution.gpu_lease import visible_gpus
from harness.pipeline.session import EXIT_INTERRUPTED
from harness.planning.run_options import RunOptions
from harness.planning.shards import parse_shard
from harness.workflows.prove import CELL, RUNS_DIR, run_stack, stack_matrix
from harness.workflows.survey import SurveyOptions, describe_plan, folded, plan, run_survey
from repros.runtime.families import FAMILIES
from repros.runtime.spec import TRACKED_PACKAGES

ATLAS_DIR = "atlas"
SURVEY_DIR = "survey"
#: How many disagreements a survey looks into by default (each a bisect): a night's share.
DEFAULT_BISECTS = 4


ALSO_FROM = "also count the evidence of a run, bisect, watch night or atlas directory (repeatable)"


def _add_sources(parser: argparse.ArgumentParser, help_text: str) -> None:
    """``--from RUN_DIR``, repeatable: the directories whose evidence counts."""
    parser.add_argument(
        "--from", dest="sources", action="append", type=Path, default=[], metavar="RUN_DIR", help=help_text
    )


class AtlasCommand(Command):
    name = "atlas"
    help = "which documented failures a stack has, from proven boundaries: build the atlas, or check a stack"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        actions = parser.add_subparsers(dest="atlas_action", required=True, metavar="{build,check,survey,export}")
        build = actions.add_parser(
            "build",
            help="write DIR/atlas.json and DIR/index.html from the catalog and the runs given",
            description="Every documented failure: per package that decides it, the last release known bad and "
            "the first known good (or open upstream), what else it was proven under, and the evidence.",
        )
        build.add_argument("--out", type=Path, required=True, metavar="DIR", help="where atlas.json and index.html go")
        _add_sources(build, "a run, bisect, watch night or atlas directory whose evidence counts (repeatable)")
        options.add_cli_options(build, ("repros_dir",))
        check = actions.add_parser(
            "check",
            help="say, per documented failure, whether a stack is affected, not affected or unknown",
            description="Answers from what was proven, running nothing (unless --prove): a stack outside every "
            "proven range is unknown, with the command that would prove it. Exit 1 when a failure is affected.",
        )
        given = check.add_mutually_exclusive_group(required=True)
        given.add_argument("--stack", metavar='"PKG==VER ..."', help='the stack\'s pins ("torch==2.5.1 peft==0.14.0")')
        given.add_argument(
            "--requirements", type=Path, metavar="FILE", help="a lock: uv.lock, pylock.toml, or pip freeze output"
        )
        given.add_argument("--here", action="store_true", help="the running interpreter's stack")
        check.add_argument(
            "--prove",
            action="store_true",
            help="build the stack as a cell, run the failures that are unknown, answer from what they saw and keep it "
            "in the atlas",
        )
        check.add_argument(
            "--atlas", type=Path, metavar="DIR", help="the atlas to read and keep evidence in (default: REPORTS/atlas)"
        )
        _add_sources(check, ALSO_FROM)
        check.add_argument(
            "--device", choices=("cpu", "cuda"), help="the device the stack trains on (--here, --prove: this machine's)"
        )
        check.add_argument(
            "--world-size",
            type=whole_number("--world-size", minimum=1),
            metavar="N",
            help="the ranks it trains with",
        )
        check.add_argument("--family", choices=list(FAMILIES), help="the model family it trains")
        check.add_argument(
            "--as-of",
            type=_day,
            metavar="YYYY-MM-DD",
            help="with --requirements: resolve what the file does not pin as of that day (its packages that decide "
            "documented failures, resolved together: pins as written, the rest released before the day)",
        )
        options.add_cli_options(check, ("repros", "reports_dir", "repros_dir"))
        options.add_cli_options(check, ("cache_dir", "cache_max_gb", "launcher", "jobs"))
        survey = actions.add_parser(
            "survey",
            help="prove what the atlas cannot answer for the stacks people run, and bisect where they disagree",
            description="The surveyed stacks (peers' pins at release tags, the stacks of the issues the catalog "
            "cites, the newest of a month), each with where it came from: groups them into the fewest environments, "
            "runs what the atlas cannot answer for them, bisects where two disagree, and keeps everything in --out "
            "(a survey stopped resumes there). Exit 0 when every question of the slice was answered, 1 when some "
            "stay unknown.",
        )
        survey.add_argument(
            "--list",
            action="store_true",
            help="print each surveyed stack as a --stack string, one a line, nothing else",
        )
        survey.add_argument(
            "--slice",
            metavar="I/N",
            help="the I-th of N stretches of the survey, in torch's order (a night's part; with --list, its stacks)",
        )
        survey.add_argument(
            "--out",
            type=Path,
            metavar="DIR",
            help="where the survey keeps its atlas, runs and bisects (default: REPORTS/survey)",
        )
        survey.add_argument(
            "--survey", type=Path, metavar="FILE", help="the stacks to survey (default: ft-regress's own survey)"
        )
        survey.add_argument(
            "--bisects",
            type=whole_number("--bisects", minimum=0),
            default=DEFAULT_BISECTS,
            metavar="N",
            help=f"look into at most N disagreements, each a bisect (default {DEFAULT_BISECTS})",
        )
        survey.add_argument(
            "--plan", action="store_true", help="say which environments it would build and run, and run nothing"
        )
        options.add_cli_options(survey, ("repros", "reports_dir", "repros_dir"))
        options.add_cli_options(survey, ("cache_dir", "cache_max_gb", "launcher", "jobs"))
        export = actions.add_parser(
            "export",
            help="write the atlas in another format: one OSV record per documented failure",
            description="One OSV-schema record per documented failure (osv.dev's format): the affected ranges of "
            "each package that decides it, the combinations they were proven under in database_specific.",
        )
        export.add_argument("--format", choices=("osv",), required=True, help="the format to write")
        export.add_argument("--out", type=Path, required=True, metavar="DIR", help="where the records go")
        export.add_argument(
            "--atlas",
            type=Path,
            metavar="DIR",
            help="the atlas to export (default: REPORTS/atlas; the catalog alone where it holds none)",
        )
        _add_sources(export, ALSO_FROM)
        options.add_cli_options(export, ("reports_dir", "repros_dir"))

    def run(self, args: argparse.Namespace, console: Console, argv: Sequence[str]) -> int:
        if args.atlas_action == "survey" and args.list:
            return _list(args)
        discovery = discover(options.check_repros_dirs(args.repros_dir))
        if args.atlas_action == "build":
            return _build(args, discovery, console)
        if args.atlas_action == "survey":
            return _survey(args, discovery, console, argv)
        if args.atlas_action == "export":
            return _export(args, discovery, console)
        return _check(args, discovery, console, argv)


def _build(args: argparse.Namespace, discovery: Discovery, console: Console) -> int:
    options.check_output_dir("--out", args.out)
    atlas, written = build_atlas(args.out, args.sources, discovery)
    boundaries = [b for f in atlas.failures for b in f.boundaries]
    contradicted = sum(1 for b in boundaries if b.status == "contradicted")
    console.print(
        f"atlas: {len(atlas.failures)} failures, {len(boundaries)} boundaries ({contradicted} contradicted), "
        f"{sum(len(f.claims) for f in atlas.failures)} claims, from {', '.join(atlas.sources)}",
        highlight=False,
        markup=False,
    )
    for note in atlas.notes:
        console.print(f"  note: {note}", highlight=False, markup=False)
    for path in written:
        console.print(f"wrote {path}", highlight=False, markup=False)
    return 0


def _day(text: str) -> str:
    try:
        return dt.date.fromisoformat(text).isoformat()
    except ValueError:
        raise argparse.ArgumentTypeError(f"--as-of takes a day (YYYY-MM-DD), not {text!r}") from None


def _resolver(args: argparse.Namespace, as_of: str) -> Callable[[list[str]], dict[str, str]]:
    """How a requirements file's lines resolve as of a day: as a floating cell's do (``locks.py``)."""
    builder = UvEnvironments(options.cache_dir(args.cache_dir), pip_index_config(), max_gb=args.cache_max_gb)

    def resolve(lines: list[str]) -> dict[str, str]:
        try:
            return builder.resolve(lines, DEFAULT_PYTHON, None, as_of=as_of)
        except EnvironmentUnavailable as exc:
            raise UserError(
                "--as-of", as_of, f"the file's lines do not resolve ({exc.reason})", "check the file"
            ) from None

    return resolve


def _stack(args: argparse.Namespace, discovery: Discovery) -> Stack:
    if args.as_of is not None and args.requirements is None:
        raise UserError("--as-of", args.as_of, "resolves a requirements file", "pass it with --requirements FILE")
    if args.stack is not None:
        return parse_stack_text(args.stack)
    if args.requirements is not None:
        if args.as_of is None:
            return read_requirements(args.requirements)
        requirements = read_requirement_file(args.requirements)
        deciding = {p for r in discovery.repros.values() for p in r.spec.deciding_packages} | set(TRACKED_PACKAGES)
        stack = resolve_requirements(requirements, args.as_of, deciding, _resolver(args, args.as_of))
        shown = Stack(source=stack.source, versions={k: v for k, v in stack.versions.items() if k in deciding})
        print(f"{stack.source}: {shown.text()}", file=sys.stderr)
        return stack
    return stack_here()


def _check(args: argparse.Namespace, discovery: Discovery, console: Console, argv: Sequence[str]) -> int:
    stack = _stack(args, discovery)
    repros = options.csv(args.repros)
    for repro in repros:
        if repro not in discovery.repros:
            raise UserError("--repros", repro, "unknown repro", unknown_repro_fix(repro, discovery.repros))
    # --here and --prove answer for this machine's device: the stack runs here.
    device = args.device or (("cuda" if visible_gpus() else "cpu") if args.here or args.prove else None)
    where = where_of(stack, device, args.world_size, args.family)
    atlas_dir: Path = args.atlas or args.reports_dir / ATLAS_DIR
    atlas = load_atlas(discovery, atlas_dir, args.sources)
    answers = check_stack(atlas, discovery, stack, where, repros, args.reports_dir)
    unknown = [a.failure for a in answers if a.verdict == UNKNOWN and a.provable]
    if args.prove and unknown:
        options.check_output_dir("--atlas", atlas_dir)
        specs = [discovery.repros[r].spec for r in unknown]
        matrix = stack_matrix(stack, specs, atlas_dir, passthrough=args.here)
        values = {
            "matrix": matrix,
            "cells": [CELL],
            "repros": [",".join(unknown)],
            "modes": ["bug"],
            "repros_dir": args.repros_dir,
            "reports_dir": atlas_dir / RUNS_DIR,
            "cache_dir": args.cache_dir,
            "cache_max_gb": args.cache_max_gb,
            "launcher": args.launcher,
            "jobs": args.jobs,
        }
        run_opts = options.selection(values)
        err = Console(stderr=True, soft_wrap=True)
        err.print(f"proving {len(unknown)} unknown failures in the stack ({matrix})", highlight=False, markup=False)
        status, run_path = run_stack(run_opts, err, argv)
        if status in (EXIT_USAGE, EXIT_INTERRUPTED) or run_path is None:
            return status
        kept = [atlas_dir] if (atlas_dir / ATLAS_FILE).is_file() else []
        sources = read_sources([*kept, run_path, *args.sources], discovery)
        atlas = assemble(discovery, sources)
        write_build(atlas_dir, atlas, sources, discovery)
        answers = check_stack(atlas, discovery, stack, where, repros, args.reports_dir)
        err.print(f"kept in {atlas_dir / ATLAS_FILE}: the run {run_path}", highlight=False, markup=False)
    for a in answers:
        console.print(a.line(), highlight=False, markup=False, soft_wrap=True)
    counts = {v: sum(1 for a in answers if a.verdict == v) for v in ("affected", "not affected", "unknown")}
    read = ", ".join(atlas.sources)
    print(
        f"{stack.source}: {counts['affected']} affected, {counts['not affected']} not affected, "
        f"{counts['unknown']} unknown (from {read})",
        file=sys.stderr,
    )
    if nothing_answered(answers):
        count = len(answers)
        asked = "the one failure asked about is" if count == 1 else f"all {count} failures asked about are"
        print(
            f"nothing was answered: {asked} unknown for this stack (outside what runs proved, as each line says); "
            "--prove runs them",
            file=sys.stderr,
        )
    return exit_status(answers)


def _surveyed(args: argparse.Namespace) -> list[SurveyStack]:
    stacks = load_survey(args.survey)
    if args.slice is None:
        return in_survey_order(stacks)
    shard = parse_shard(args.slice, "--slice")
    return slice_of(stacks, shard.index, shard.count)


def _list(args: argparse.Namespace) -> int:
    for stack in _surveyed(args):
        print(stack.text())
    return 0


def _survey(args: argparse.Namespace, discovery: Discovery, console: Console, argv: Sequence[str]) -> int:
    everything = in_survey_order(load_survey(args.survey))
    stacks = _surveyed(args)
    device = "cuda" if visible_gpus() else "cpu"
    failures = list(options.csv(args.repros))
    for repro in failures:
        if repro not in discovery.repros:
            raise UserError("--repros", repro, "unknown repro", unknown_repro_fix(repro, discovery.repros))
    if not failures:
        failures = [r for r, repro in discovery.repros.items() if runnable_on(repro.spec, device)]
    out: Path = args.out or args.reports_dir / SURVEY_DIR
    options.check_output_dir("--out", out)
    opts = SurveyOptions(
        out=out, survey=everything, stacks=stacks, failures=failures, device=device, bisects=args.bisects, argv=argv
    )
    err = Console(stderr=True, soft_wrap=True)
    if args.plan:
        describe_plan(plan(opts, folded(out, discovery, write=False), discovery), console)
        return 0

    def make_run(matrix: Path, repros: Sequence[str], out_dir: Path | None) -> RunOptions:
        values = {
            "matrix": matrix,
            "cells": [CELL],
            "repros": [",".join(repros)],
            "modes": ["bug"],
            "repros_dir": args.repros_dir,
            "reports_dir": out / RUNS_DIR,
            "cache_dir": args.cache_dir,
            "cache_max_gb": args.cache_max_gb,
            "launcher": args.launcher,
            "jobs": args.jobs,
        }
        return options.selection(values, out_dir=out_dir)

    return run_survey(opts, discovery, make_run, err)


def _export(args: argparse.Namespace, discovery: Discovery, console: Console) -> int:
    options.check_output_dir("--out", args.out)
    atlas = load_atlas(discovery, args.atlas or args.reports_dir / ATLAS_DIR, args.sources)
    written = write_osv(args.out, atlas, discovery)
    console.print(f"wrote {len(written)} OSV records to {args.out}", highlight=False, markup=False)
    return 0
