"""``run``: a lane (or chosen cells) of the matrix; ``run --resume DIR`` finishes an interrupted run."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from harness.analysis.explore.last_run import LastRun, last_observed
from harness.analysis.explore.save import save_run
from harness.cli import options
from harness.cli.commands.base import Command
from harness.core.errors import UserError
from harness.core.json import JsonValue
from harness.core.text import plain
from harness.execution.scheduler import Machine
from harness.pipeline.session import RunEnding, RunSession
from harness.planning.items import Plan, plan_items
from harness.planning.run_options import RunOptions
from harness.records.item import ItemRecord
from harness.records.run_dir import RunDir
from harness.records.run_meta import RunMeta
from harness.reports.run_cost import RunCost
from harness.reports.run_end import print_run_end

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
        options.add_cli_options(parser, options.CACHE_OPTIONS)
        options.add_cli_options(parser, options.STACK_OPTIONS)
        options.add_cli_options(parser, options.ATTEMPT_OPTIONS)
        options.add_executor_options(parser)
        options.add_cli_options(parser, ("shard", "repros_dir"))
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
        opts = options.selection(
            vars(args),
            out_dir=args.out,
            explore=args.explore or args.save_expectations,
            save_expectations=args.save_expectations,
        )
        return execute(opts, console, argv)


def run_ending(opts: RunOptions, plan: Plan, console: Console) -> RunEnding:
    """How ``run`` ends: its summary (``reports/run_end.py``), then with ``--save-expectations`` what
    it observed kept as the repros' expectations (``analysis/explore/save.py``)."""

    def ended(records: Sequence[ItemRecord], meta: RunMeta, interrupted: bool) -> dict[str, JsonValue]:
        cost = RunCost.of(meta, records, Machine.detect().cpus)
        print_run_end(console, records, meta.cells, plan.excluded, saving=opts.save_expectations, cost=cost)
        if opts.save_expectations and not interrupted:
            save_run(opts, records, meta.cells, lambda text: console.print(plain(text), highlight=False, markup=False))
        return {"cost": {**dataclasses.asdict(cost), "floor_s": round(cost.floor_s, 1)}}

    return ended


def execute(opts: RunOptions, console: Console, argv: Sequence[str], resume: Path | None = None) -> int:
    """Run the planned items; return the exit status (0 all matched, 1 otherwise, 2 when a record
    could not be written, 130 when interrupted). With ``resume``, run only what that run lacks. With
    ``--save-expectations`` where the last run observed every planned item as it would be observed
    now (``analysis/explore/last_run.py``), save what it saw instead of running anything again."""
    plan = plan_items(opts)
    if opts.save_expectations and resume is None:
        last = last_observed(opts, plan.items)
        if last is not None:
            return save_last(opts, last, console)
    return RunSession(opts, console, argv, resume, plan=plan, on_finished=run_ending(opts, plan, console)).execute()


def save_last(opts: RunOptions, last: LastRun, console: Console) -> int:
    """``--save-expectations`` from the last run's records: said, then saved as a run would save them."""

    def say(text: str) -> None:
        console.print(plain(text), highlight=False, markup=False)

    say(
        f"saving what {last.dir.path} observed ({len(last.records)} items, started {last.meta.started_at}; the same "
        "matrix, stacks and repro files): nothing runs again. To observe them again first, run without "
        "--save-expectations"
    )
    save_run(opts, last.records, last.meta.cells, say)
    return 0


def resumed_options(args: argparse.Namespace) -> RunOptions:
    """The options of the run in ``--resume DIR``, as its run.json keeps them (``RunOptions.restored``);
    where it ran and how many times an item runs may be given again."""
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
    cache = stored.get("cache_dir")
    restored = RunOptions.restored(
        stored,
        run_dir.meta_path,
        cache_dir=options.cache_dir(Path(cache) if isinstance(cache, str) else None, for_writing=True),
        out_dir=args.resume,
        shard_items=tuple(meta.shard.items) if meta.shard else None,
    )
    values = vars(args)
    opts = dataclasses.replace(
        restored,
        executor=options.executor_choice(values, base=restored.executor),
        attempts=options.attempt_policy(values, base=restored.attempts),
        cache=restored.cache.evolve(cache_max_gb=args.cache_max_gb or restored.cache.cache_max_gb),
        explore=restored.explore or args.save_expectations,
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
