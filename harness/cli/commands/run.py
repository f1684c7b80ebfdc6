"""``run``: a lane (or chosen cells) of the matrix; ``run --resume DIR`` finishes an interrupted run."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from rich.console import Console

from harness.analysis.explore.run_end import run_ending
from harness.cli import options
from harness.cli.commands.base import Command
from harness.core.errors import UserError
from harness.pipeline.session import RunSession
from harness.planning.items import RunOptions, plan_items
from harness.planning.shards import parse_shard
from harness.records.run_dir import RunDir

#: What a resumed run takes from its run.json; giving any of these with --resume is refused.
SELECTION_FLAGS = (
    ("--matrix", "matrix"),
    ("--lane", "lane"),
    ("--cells", "cells"),
    ("--repros", "repros"),
    ("--modes", "modes"),
    ("--repros-dir", "repros_dir"),
    ("--out", "out"),
    ("--pin", "pin"),
    ("--shard", "shard"),
    ("--cache-dir", "cache_dir"),
    ("--reports-dir", "reports_dir"),
    ("--model", "model"),
    ("--world-size", "world_size"),
    ("--family", "family"),
    ("--explore", "explore"),
    ("--as-of", "as_of"),
)


def parse_pins(texts: Sequence[str]) -> tuple[tuple[str, str], ...]:
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


class RunCommand(Command):
    name = "run"
    help = "run a lane (or chosen cells) of the matrix"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        options.add_cli_options(parser, ("matrix", "lane", "cells", "repros", "modes", "out", "reports_dir"))
        parser.add_argument(
            "--resume",
            type=Path,
            metavar="DIR",
            help="finish an interrupted run: plan it as it was and run only the items DIR has no record of "
            "(--launcher, --jobs, --reruns and --repeat may be given again; the selection may not)",
        )
        options.add_cli_options(parser, ("cache_dir", "cache_max_gb"))
        parser.add_argument(
            "--pin",
            action="append",
            default=[],
            metavar="PKG==VER",
            help="pin a package over the selected cells' own spec (repeatable)",
        )
        options.add_cli_options(
            parser, ("launcher", "jobs", "reruns", "repeat", "model", "world_size", "family", "as_of")
        )
        options.add_cli_options(parser, ("executor", "ray_address", "slurm_folder", "slurm_param"))
        parser.add_argument(
            "--shard",
            metavar="I/N",
            help="run only shard I of N of the planned items, balanced by the durations of the runs in --reports-dir",
        )
        options.add_cli_options(parser, ("repros_dir",))
        parser.add_argument(
            "--explore",
            action="store_true",
            help="report what each repro does in each cell (where it fails, where it runs, with what) instead of "
            "checking expectations; exit 0 unless something could not run (a repro without expectations is "
            "always explored)",
        )
        parser.add_argument(
            "--save-expectations",
            action="store_true",
            help="explore, then write what was observed back as the repros' expectations, each with the command "
            "that established it (a script repro's declaration is edited; a repro in code gets lines to paste)",
        )

    def run(self, args: argparse.Namespace, console: Console, argv: Sequence[str]) -> int:
        if args.resume:
            return execute(resumed_options(args), console, argv, resume=args.resume)
        shard = parse_shard(args.shard) if args.shard is not None else None
        opts = options.selection(
            vars(args),
            out_dir=args.out,
            pins=parse_pins(args.pin),
            shard=shard,
            explore=args.explore or args.save_expectations,
            save_expectations=args.save_expectations,
        )
        return execute(opts, console, argv)


def execute(opts: RunOptions, console: Console, argv: Sequence[str], resume: Path | None = None) -> int:
    """Run the planned items; return the exit status (0 all matched, 1 otherwise, 2 when a record
    could not be written, 130 when interrupted). With ``resume``, run only what that run lacks."""
    plan = plan_items(opts)
    return RunSession(opts, console, argv, resume, plan=plan, on_finished=run_ending(opts, plan, console)).execute()


def resumed_options(args: argparse.Namespace) -> RunOptions:
    """The options of the run in ``--resume DIR``, as its run.json keeps them."""
    given = [flag for flag, dest in SELECTION_FLAGS if getattr(args, dest, None) not in (None, [], (), False)]
    # --reports-dir has a default: only a different value counts as given.
    if "--reports-dir" in given and args.reports_dir == Path("reports"):
        given.remove("--reports-dir")
    if given:
        raise UserError(
            "--resume", given[0], "cannot be combined with --resume", "the run's own selection is reused; drop it"
        )
    run_dir = RunDir.existing(args.resume)
    meta = run_dir.read_meta(required=True)
    stored = meta.options
    if stored is None:
        raise UserError(run_dir.meta_path, "options", "records no options to resume with", "start a new run instead")
    values = {
        "matrix": Path(stored.matrix),
        "lane": stored.lane,
        "cells": stored.cells,
        "repros": stored.repros,
        "modes": stored.modes,
        "repros_dir": [Path(d) for d in stored.repros_dirs],
        "cache_dir": Path(stored.cache_dir) if stored.cache_dir else None,
        "model": stored.model,
        "world_size": stored.world_size,
        "family": ",".join(stored.families) or None,
        "as_of": stored.as_of,
        "launcher": args.launcher or stored.launcher,
        "executor": args.executor or stored.executor,
        "ray_address": args.ray_address or stored.ray_address,
        "slurm_folder": args.slurm_folder or stored.slurm_folder,
        "slurm_param": args.slurm_param or [f"{k}={v}" for k, v in stored.slurm_parameters],
        "jobs": args.jobs if args.jobs is not None else stored.jobs,
        "reruns": args.reruns if args.reruns is not None else stored.reruns,
        "repeat": args.repeat if args.repeat is not None else stored.repeat,
    }
    opts = options.selection(
        values,
        out_dir=args.resume,
        pins=tuple(stored.pins),
        shard=parse_shard(stored.shard) if stored.shard else None,
        shard_items=tuple(meta.shard.items) if meta.shard else None,
        reports_dir=Path(stored.reports_dir),
        explore=stored.explore or args.save_expectations,
        save_expectations=args.save_expectations,
    )
    if meta.matrix is not None and opts.matrix.sha256 != meta.matrix.sha256:
        # The rest of the run would be planned from the edited file while run.json and the records
        # written so far describe the first one: refused, never mixed.
        raise UserError(
            opts.matrix.path,
            "",
            f"has changed since run {meta.run_id or args.resume} started (sha256 {meta.matrix.sha256[:12]} then, "
            f"{opts.matrix.sha256[:12]} now): its rest would be planned from another matrix than its start",
            "put the file back as it was to resume, or start a new run with the edited matrix",
        )
    return opts
