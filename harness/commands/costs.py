"""``costs``: every workaround of the selected repros, in the selected cells, at the small model:
does it train, and what does it cost against the documented configuration."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from harness import options
from harness.commands.base import Command
from harness.costs import COSTS_FILE, entries, plan_costs, write_costs
from harness.errors import EXIT_USAGE, UserError
from harness.observe import now
from harness.pipeline import EXIT_INTERRUPTED, RunSession, new_run_id
from harness.run_dir import RunDir
from harness.summary import format_bytes
from harness.terminal import plain
from repros.common.outcomes import UNOBSERVED, Outcome


def _cost_text(entry: dict) -> Text:
    style = "green" if entry["outcome"] == "PASS" else "red"
    text = Text(entry["outcome"] + (f" {entry['signature']}" if entry.get("signature") else ""), style=style)
    mem = entry.get("train_peak_mem_bytes")
    cpu = entry.get("step_cpu_time_s")
    text.append(f"\n{format_bytes(int(mem)) if mem is not None else '-'} · "
                f"{f'{cpu * 1000:.0f} ms cpu' if cpu is not None else '-'}", style="dim")
    priced = entry.get("against_documented") or {}
    against = ""
    if "train_peak_mem_ratio" not in priced and entry.get("against_fixed_trainer"):
        priced, against = entry["against_fixed_trainer"], "vs fixed trainer: "
    if "train_peak_mem_ratio" in priced:
        text.append(f"\n{against}mem x{priced['train_peak_mem_ratio']:.2f}", style="cyan")
        if "step_cpu_time_s_ratio" in priced:
            noise = priced.get("step_cpu_noise_ratio")
            text.append(f" · cpu x{priced['step_cpu_time_s_ratio']:.2f}" + (f" (±{noise:.0%})" if noise else ""),
                        style="cyan")
    if entry.get("rounds", 1) > 1:
        spread = entry.get("spread") or {}
        parts = [f"{k} {v:.1%}" for k, v in spread.items() if v is not None and k != "step_time"]
        if parts:
            text.append("\nrun to run: " + ", ".join(parts), style="dim")
    return text


def costs_table(found: list[dict]) -> Table:
    cells = list(dict.fromkeys(e["cell"] for e in found))
    rows = list(dict.fromkeys((e["repro"], e["variant"]) for e in found))
    by_key = {(e["repro"], e["variant"], e["cell"]): e for e in found}
    table = Table(
        title="what each workaround costs: outcome · training peak memory · CPU time per step · "
        "x the documented configuration where it trains (else x the fixed trainer)",
        show_lines=True,
    )
    table.add_column("repro / variant", style="bold")
    for cell in cells:
        table.add_column(cell)
    for repro, variant in rows:
        row: list[Text | str] = [f"{repro} / {variant}"]
        for cell in cells:
            entry = by_key.get((repro, variant, cell))
            row.append(_cost_text(entry) if entry else Text("-", style="dim"))
        table.add_row(*row)
    return table


class CostsCommand(Command):
    name = "costs"
    help = "run every workaround of the selected repros at the small model: does it train, what does it cost"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        options.add_cli_options(parser, ("matrix", "lane", "cells", "repros", "out", "cache_dir", "launcher", "repros_dir"))
        parser.add_argument("--model", choices=("tiny", "small"), default="small",
                            help="the test model's size (default: small, where the costs show)")
        parser.add_argument("--variants", type=options.csv, default=(), metavar="A,B",
                            help="only these variants (default: every one of each selected repro)")
        parser.add_argument("--rounds", type=int, default=1,
                            help="run everything this many times, interleaved, for the run-to-run spread (default 1)")

    def run(self, args: argparse.Namespace, console: Console, argv: Sequence[str]) -> int:
        if args.rounds < 1:
            raise UserError("--rounds", str(args.rounds), "runs nothing", "pass 1 or more")
        base = options.selection(vars(args))
        out = Path(args.out or base.reports_dir / f"costs-{new_run_id()}")
        if (out / COSTS_FILE).exists():
            raise UserError(out, COSTS_FILE, "already holds a costs table", "choose a new --out directory")
        plan = plan_costs(base, args.variants)
        if not plan.items:
            raise UserError("--repros", ",".join(base.repros) or "(all)", "plans no item here",
                            "pick repros and cells that run together")
        rounds = []
        started = now()
        interrupted: str | None = None
        for number in range(1, args.rounds + 1):
            opts = dataclasses.replace(base, out_dir=out / f"round-{number}")
            console.print(f"costs: round {number} of {args.rounds}, {len(plan.items)} items", highlight=False)
            status = RunSession(opts, console, argv, None, plan=plan, kind="costs").execute()
            round_dir = RunDir(out / f"round-{number}")
            rounds.append(round_dir.records())
            if status == EXIT_INTERRUPTED or status == EXIT_USAGE:
                # What ran is kept and priced; the table says it is partial, and no further round starts.
                interrupted = str(round_dir.read_meta().get("interrupted") or "a record could not be written")
                break
        found = entries(rounds, {k: r.spec for k, r in base.discovery.repros.items()})
        meta = {"started_at": started, "finished_at": now(), "argv": list(argv), "model": base.model,
                "rounds": len(rounds)}
        if interrupted:
            meta |= {"interrupted": interrupted, "planned_items": len(plan.items) * args.rounds,
                     "ran_items": sum(len(r) for r in rounds)}
        path = write_costs(out / COSTS_FILE, found, meta)
        console.print(costs_table(found))
        for entry in found:
            if entry.get("claim") and entry["outcome"] != "PASS":
                console.print(plain(f"claim not borne out in {entry['cell']}: {entry['repro']} {entry['variant']} "
                                    f"({entry['claim']}) ended {entry['outcome']}"), highlight=False, markup=False)
        console.print(f"costs: {path}", highlight=False, markup=False)
        if interrupted:
            console.print(f"costs: interrupted ({interrupted}) after {meta['ran_items']} of {meta['planned_items']} "
                          "items: the table holds only what ran", highlight=False, markup=False)
            return EXIT_INTERRUPTED
        unobserved = [e for e in found if e["outcome"] in UNOBSERVED or e["outcome"] == Outcome.CRASH]
        return 1 if unobserved else 0
