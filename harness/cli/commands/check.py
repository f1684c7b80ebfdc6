"""``check``: every documented failure and the fixed trainer against the running interpreter's own stack.

No matrix: one passthrough cell (``harness/cli/check_matrix.yaml``, the interpreter as it is), at
the world size its GPUs allow (one rank per visible GPU, two at most; two CPU ranks where there is no
GPU; ``--world-size`` to choose), run exactly as ``run`` runs a cell, into a run directory like
``run``'s. It prints per failure whether this stack has it, has it not, or cannot run it here and
why, with what the fixed trainer did and what its guards cost; exit 1 when the stack has one, 0
when it has none, 2 when nothing could be checked (no selected failure could run here: a stack without
what they need), 2 on a usage error.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from rich.console import Console

from harness.cli import options
from harness.cli.commands.base import Command
from harness.core.errors import EXIT_NOTHING_CHECKED, UserError
from harness.core.text import plain
from harness.environments.stacks import read_interpreter
from harness.execution.gpu_lease import visible_gpus
from harness.pipeline.session import RunSession
from harness.planning.crosscheck import CROSSCHECK
from harness.planning.items import RunOptions, plan_items
from harness.records.item import ItemRecord
from harness.records.run_meta import RunMeta
from harness.reports.check_summary import check_verdicts, conclusion, nothing_checked, stack_has_a_failure
from harness.reports.crosscheck_table import print_crosscheck
from harness.reports.terminal import print_summary
from repros.runtime.outcomes import Outcome

#: The matrix of ``check``: one passthrough cell, ``here``.
CHECK_MATRIX = Path(__file__).resolve().parents[1] / "check_matrix.yaml"
CHECK_CELL = "here"
#: Ranks where there is no GPU: most documented failures need two to occur at all.
CPU_WORLD_SIZE = 2
#: The most GPUs a check uses (every documented failure occurs at two ranks).
MAX_WORLD_SIZE = 2

EXIT_HAS_A_FAILURE = 1


def default_world_size(gpus: Sequence[str]) -> int:
    """One rank per visible GPU, two at most; two CPU ranks where there is none."""
    return min(len(gpus), MAX_WORLD_SIZE) if gpus else CPU_WORLD_SIZE


def _require_torch_here() -> None:
    listing = read_interpreter(sys.executable)  # as the passthrough cell and `atlas check --here` read it
    if "torch" not in listing.packages:
        raise UserError(
            sys.executable,
            "torch",
            "is not installed in the interpreter check runs in (check reads its own stack)",
            "install ft-regress into the environment that holds your torch stack and run its ft-regress check",
        )


def check_options(values: Mapping[str, object], out: Path | None, world_size: int) -> RunOptions:
    """``run``'s options for the check cell: the built-in repros (every documented failure) or those asked."""
    opts = options.selection(
        {**values, "matrix": CHECK_MATRIX, "cells": [CHECK_CELL], "world_size": world_size}, out_dir=out
    )
    if opts.selection.repros:
        return opts
    built_in = tuple(r for r, repro in sorted(opts.discovery.repros.items()) if repro.module.startswith("repros."))
    # And the strategies held against one process (the check matrix's crosscheck section).
    return dataclasses.replace(opts, selection=opts.selection.evolve(repros=(*built_in, CROSSCHECK)))


#: What ``check --help`` says of the options whose ``run`` help speaks of a matrix and its cells.
CHECK_HELPS = {
    "repros": "repro ids, comma-separated, e.g. F1,F5 (default: every documented failure)",
    "world_size": "ranks per item (default: one per visible GPU, two at most; two CPU ranks where there is none)",
    "model": "the test model's size: tiny (correctness, default) or small (measuring; tens of millions of parameters)",
    "family": "the model families to run in, comma-separated (qwen2, llama, mistral, gemma2, phi3, qwen2-moe, "
    "llava; default: qwen2)",
    "cache_dir": "where ops compiled at first use (DeepSpeed's, torch's) are kept (default: $FT_REGRESS_CACHE, else "
    "$XDG_CACHE_HOME/ft-regress, else ~/.cache/ft-regress)",
    "launcher": "worker: fork each item's ranks from a pre-imported worker (default, or $FT_REGRESS_LAUNCHER); "
    "torchrun: a bare torchrun per item",
}


class CheckCommand(Command):
    name = "check"
    help = "every documented failure and the fixed trainer against this interpreter's own stack"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        names = ("repros", "modes", "out", "reports_dir", "world_size", "cache_dir", "launcher", "jobs", "model")
        options.add_cli_options(parser, (*names, "family"), helps=CHECK_HELPS)

    def run(self, args: argparse.Namespace, console: Console, argv: Sequence[str]) -> int:
        _require_torch_here()
        gpus = visible_gpus()
        world_size = args.world_size if args.world_size is not None else default_world_size(gpus)
        values = {k: v for k, v in vars(args).items() if k not in ("matrix", "cells", "lane", "world_size")}
        opts = check_options(values, args.out, world_size)
        plan = plan_items(opts)
        where = f"{len(gpus)} GPU(s) visible" if gpus else "no GPU: CPU ranks on gloo"
        console.print(
            plain(f"check: {sys.executable}, world size {world_size} ({where}), {len(plan.items)} items"),
            highlight=False,
            markup=False,
        )
        found: dict[str, bool] = {}

        def ended(records: Sequence[ItemRecord], meta: RunMeta, interrupted: bool) -> None:
            repros = [r for r in records if r.kind != "crosscheck"]
            print_summary(console, repros, plan.excluded)
            known = [repro.spec for repro in opts.discovery.repros.values()]
            verdicts = check_verdicts(repros, [e for e in plan.excluded if e.repro != CROSSCHECK], known)
            console.print(plain("\nthis stack, failure by failure:"), highlight=False, markup=False)
            for verdict in verdicts:
                console.print(plain(verdict.line()), highlight=False, markup=False)
            print_crosscheck(console, records)
            compared = [
                r for r in records if r.kind == "crosscheck" and r.outcome in (Outcome.AGREES, Outcome.DIVERGES)
            ]
            diverged = [r for r in compared if r.outcome == Outcome.DIVERGES]
            found["has"] = stack_has_a_failure(verdicts) or bool(diverged)
            found["nothing"] = nothing_checked(verdicts) and not compared
            console.print(plain(conclusion(verdicts, len(diverged))), highlight=False, markup=False)

        status = RunSession(opts, console, argv, None, plan=plan, kind="check", on_finished=ended).execute()
        if status not in (0, 1):
            return status  # a usage or write error, an interrupt
        if found.get("has"):
            return EXIT_HAS_A_FAILURE
        return EXIT_NOTHING_CHECKED if found.get("nothing", True) else 0
