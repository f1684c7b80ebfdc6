"""``run``: a lane (or chosen cells) of the matrix; ``run --resume DIR`` finishes an interrupted run."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from rich.console import Console

from harness import options
from harness.commands.base import Command
from harness.errors import UserError
from harness.pipeline import execute
from harness.planning import RunOptions
from harness.run_dir import RunDir
from harness.shard import parse_shard

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
    ("--explore", "explore"),
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
            "(--launcher, --jobs and --reruns may be given again; the selection may not)",
        )
        options.add_cli_options(parser, ("cache_dir",))
        parser.add_argument(
            "--pin",
            action="append",
            default=[],
            metavar="PKG==VER",
            help="pin a package over the selected cells' own spec (repeatable)",
        )
        options.add_cli_options(parser, ("launcher", "jobs", "reruns", "model"))
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
    stored = meta.get("options")
    if not isinstance(stored, dict):
        raise UserError(run_dir.meta_path, "options", "records no options to resume with", "start a new run instead")
    shard_meta = meta.get("shard") if isinstance(meta.get("shard"), dict) else None
    try:
        values = {
            "matrix": Path(stored["matrix"]),
            "lane": stored["lane"],
            "cells": stored["cells"],
            "repros": stored["repros"],
            "modes": stored["modes"],
            "repros_dir": [Path(d) for d in stored["repros_dirs"]],
            "cache_dir": Path(stored["cache_dir"]) if stored.get("cache_dir") else None,
            "model": stored.get("model"),
        }
        more = {
            "out_dir": args.resume,
            "pins": tuple((name, spec) for name, spec in stored["pins"]),
            "shard": parse_shard(stored["shard"]) if stored.get("shard") else None,
            "shard_items": tuple(shard_meta["items"]) if shard_meta else None,
            "reports_dir": Path(stored.get("reports_dir") or "reports"),
            "explore": bool(stored.get("explore")) or args.save_expectations,
            "save_expectations": args.save_expectations,
        }
        values["launcher"] = args.launcher or stored.get("launcher")
        values["jobs"] = args.jobs if args.jobs is not None else int(stored.get("jobs", 1))
        values["reruns"] = args.reruns if args.reruns is not None else int(stored.get("reruns", 0))
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(run_dir.meta_path, "options", f"is incomplete ({exc})", "start a new run instead") from None
    return options.selection(values, **more)
