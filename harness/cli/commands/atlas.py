"""``atlas build`` and ``atlas check``: which documented failures a stack has, from proven boundaries.

``atlas build --out DIR [--from RUN_DIR ...]`` writes ``DIR/atlas.json`` and ``DIR/index.html`` from the catalog's
expectations and the runs, bisects, watch nights and atlases given (and ``DIR/issues/*.md``, one per release a
watch night named as a regression's culprit). ``atlas check (--stack "torch==2.5.1 ..." | --requirements FILE |
--here)`` prints one line per documented failure: its id, ``affected``, ``not affected`` or ``unknown``, and why;
it runs nothing unless ``--prove``, which builds the stack as a cell, runs what is unknown, and keeps what it saw
in the atlas (``--atlas DIR``, default ``<reports-dir>/atlas``).

Exit status (check): 1 when the stack has a documented failure, 0 when it has none proven; (build) 0;
2 for a usage error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from harness.analysis.atlas.build import assemble, build_atlas, write_build
from harness.analysis.atlas.check import UNKNOWN, check_stack, exit_status, load_atlas, where_of
from harness.analysis.atlas.evidence import read_sources
from harness.analysis.atlas.model import ATLAS_FILE
from harness.cli import options
from harness.cli.commands.base import Command
from harness.config.repros import Discovery, discover
from harness.core.errors import EXIT_USAGE, UserError
from harness.core.names import unknown_repro_fix
from harness.core.option import whole_number
from harness.environments.stacks import Stack, parse_stack_text, read_requirements, stack_here
from harness.execution.gpu_lease import visible_gpus
from harness.pipeline.session import EXIT_INTERRUPTED
from harness.workflows.prove import CELL, RUNS_DIR, run_stack, stack_matrix
from repros.runtime.families import FAMILIES

ATLAS_DIR = "atlas"


class AtlasCommand(Command):
    name = "atlas"
    help = "which documented failures a stack has, from proven boundaries: build the atlas, or check a stack"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        actions = parser.add_subparsers(dest="atlas_action", required=True, metavar="{build,check}")
        build = actions.add_parser(
            "build",
            help="write DIR/atlas.json and DIR/index.html from the catalog and the runs given",
            description="Every documented failure: per package that decides it, the last release known bad and "
            "the first known good (or open upstream), what else it was proven under, and the evidence.",
        )
        build.add_argument("--out", type=Path, required=True, metavar="DIR", help="where atlas.json and index.html go")
        build.add_argument(
            "--from",
            dest="sources",
            action="append",
            type=Path,
            default=[],
            metavar="RUN_DIR",
            help="a run, bisect, watch night or atlas directory whose evidence counts (repeatable)",
        )
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
        check.add_argument(
            "--from",
            dest="sources",
            action="append",
            type=Path,
            default=[],
            metavar="RUN_DIR",
            help="also count the evidence of a run, bisect, watch night or atlas directory (repeatable)",
        )
        check.add_argument(
            "--device", choices=("cpu", "cuda"), help="the device the stack trains on (--here, --prove: this machine's)"
        )
        check.add_argument(
            "--world-size", type=whole_number("--world-size"), metavar="N", help="the ranks it trains with"
        )
        check.add_argument("--family", choices=list(FAMILIES), help="the model family it trains")
        options.add_cli_options(check, ("repros", "reports_dir", "repros_dir"))
        options.add_cli_options(check, ("cache_dir", "cache_max_gb", "launcher", "jobs"))

    def run(self, args: argparse.Namespace, console: Console, argv: Sequence[str]) -> int:
        discovery = discover(options.check_repros_dirs(args.repros_dir))
        if args.atlas_action == "build":
            return _build(args, discovery, console)
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


def _stack(args: argparse.Namespace) -> Stack:
    if args.stack is not None:
        return parse_stack_text(args.stack)
    if args.requirements is not None:
        return read_requirements(args.requirements)
    return stack_here()


def _check(args: argparse.Namespace, discovery: Discovery, console: Console, argv: Sequence[str]) -> int:
    stack = _stack(args)
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
        write_build(atlas_dir, atlas, sources)
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
    return exit_status(answers)
