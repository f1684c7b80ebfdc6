"""``cache``: what the environment cache holds (sizes, last use, the cells that used each), and
pruning it to a budget (never an environment in use)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from harness.cli import options
from harness.cli.commands.base import Command
from harness.core.option import gigabytes
from harness.environments.cache import (
    GB,
    budget_bytes,
    cache_bytes,
    entries,
    evict_to_fit,
    prune_store,
    share_existing,
)


def _gb(n: int | None) -> str:
    return "-" if n is None else f"{n / GB:.2f} GB"


class CacheCommand(Command):
    name = "cache"
    help = "list the environment cache (size, last use, cells) or prune it to a budget"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "action",
            nargs="?",
            choices=("list", "prune", "share"),
            default="list",
            help="list (default); prune to a budget; share: link the files environments built before sharing "
            "hold in common (each checked whole first)",
        )
        options.add_cli_options(parser, ("cache_dir",))
        parser.add_argument(
            "--max-gb",
            type=gigabytes("--max-gb"),
            metavar="GB",
            help="prune: remove the least recently used environments not in use until the cache fits in GB "
            "(default: the budget runs use, --cache-max-gb's default)",
        )

    def run(self, args: argparse.Namespace, console: Console, argv: Sequence[str]) -> int:
        cache_dir = options.cache_dir(args.cache_dir)
        if args.action == "share":
            before = cache_bytes(cache_dir)
            for entry in entries(cache_dir):
                shared = share_existing(cache_dir, entry.key)
                what = "skipped (in use, damaged or not ready)" if shared is None else f"{shared.files} files shared"
                console.print(f"{entry.key}: {what}", highlight=False)
            console.print(f"{cache_dir}: {_gb(before)} -> {_gb(cache_bytes(cache_dir))} on disk", highlight=False)
            return 0
        if args.action == "prune":
            budget = budget_bytes(cache_dir, args.max_gb)
            before = cache_bytes(cache_dir)
            done = evict_to_fit(cache_dir, budget)
            freed_store = prune_store(cache_dir)
            for entry in done.removed:
                console.print(
                    f"removed {entry.key} ({_gb(entry.apparent_bytes)}, last used {entry.last_used or '?'} "
                    f"by {', '.join(entry.cells) or '?'})",
                    highlight=False,
                )
            if done.kept_in_use:
                console.print(f"kept, in use: {', '.join(done.kept_in_use)}", highlight=False)
            console.print(
                f"{cache_dir}: {_gb(before)} -> {_gb(cache_bytes(cache_dir))} (budget {_gb(budget)}; "
                f"{len(done.removed)} environments removed, {_gb(freed_store)} of shared files freed)",
                highlight=False,
            )
            return 0 if done.after_bytes <= budget else 1
        found = entries(cache_dir, with_own_bytes=True)
        table = Table(title=f"{cache_dir}: {len(found)} environments, {_gb(cache_bytes(cache_dir))} on disk")
        for column in ("environment", "size", "its own", "last used", "cells", "state"):
            table.add_column(column)
        for entry in reversed(found):
            state = "in use" if entry.in_use else "ready" if entry.ready else "not ready"
            table.add_row(
                entry.key,
                _gb(entry.apparent_bytes),
                _gb(entry.own_bytes),
                entry.last_used or "-",
                ", ".join(entry.cells[-4:]) or "-",
                state,
            )
        console.print(table)
        console.print(
            "size: every file it holds; its own: what only it holds (the rest is shared with other "
            f"environments); budget {_gb(budget_bytes(cache_dir))}",
            highlight=False,
        )
        return 0
