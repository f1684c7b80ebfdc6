"""``catalog``: write or check ``docs/CATALOG.md`` against the repros' declarations."""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from harness.analysis import catalog
from harness.cli.commands.base import Command
from harness.config.repros import discover
from harness.core.errors import UserError
from harness.execution.launchers.supervision import WORKER_PACKAGE_DIR


class CatalogCommand(Command):
    name = "catalog"
    help = "write (--write) or check (--check) docs/CATALOG.md from the repros' SPECs; print it otherwise"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--path",
            type=Path,
            default=catalog.catalog_path(WORKER_PACKAGE_DIR.parent),
            help="the catalog file (default: %(default)s)",
        )
        what = parser.add_mutually_exclusive_group()
        what.add_argument("--write", action="store_true", help="rewrite the generated part of the file")
        what.add_argument("--check", action="store_true", help="exit 1 when the file's generated part is stale")

    def run(self, args: argparse.Namespace, console: Console, argv: Sequence[str]) -> int:
        discovery = discover()
        if discovery.broken:
            stem, broken = next(iter(discovery.broken.items()))
            raise UserError(broken.module, "SPEC", broken.reason, "fix the repro before cataloguing it")
        try:
            current = args.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            if args.check:
                raise UserError(
                    args.path, "", "does not exist", "write it with: python -m harness catalog --write"
                ) from None
            current = catalog.starter()
        wanted = catalog.render(current, discovery.repros.values())
        if args.write:
            args.path.parent.mkdir(parents=True, exist_ok=True)
            args.path.write_text(wanted, encoding="utf-8")
            console.print(f"wrote {args.path}", highlight=False, markup=False)
            return 0
        if args.check:
            if wanted == current:
                return 0
            diff = difflib.unified_diff(
                current.splitlines(), wanted.splitlines(), str(args.path), "generated", lineterm=""
            )
            print("\n".join(list(diff)[:80]))
            print(f"{args.path} is stale: python -m harness catalog --write")
            return 1
        print(wanted)
        return 0
