"""``explain LOG``: which documented failure a traceback or CI log shows (``-``: stdin), which
versions the harness measured as affected and fixed, where your versions fall, and what each
workaround costs; or "not a documented failure" with the closest candidates.

Exit status: 0 when the log shows a documented failure (or one of your repros' failures), 1 when
not, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from harness import options
from harness.commands.base import Command
from harness.costs import newest_costs, read_costs
from harness.errors import UserError
from harness.explain import (
    DOCUMENTED,
    Explanation,
    SignatureMatch,
    cost_lines,
    explain,
    guard_lines,
    measured_lines,
    versions_line,
)
from harness.installed import from_freeze, here
from harness.invocation import program_text
from harness.log_errors import logged_errors
from harness.matrix import declared_repros_dirs
from harness.repro_registry import discover
from harness.terminal import plain
from repros.common.kinds.script import PARAM

#: The most of a log read: its end, where the failure usually is.
MAX_LOG_BYTES = 64 << 20


def read_log(path: str) -> tuple[str, bool]:
    """The log's text (its last ``MAX_LOG_BYTES``) and whether it was cut."""
    if path == "-":
        data = sys.stdin.buffer.read()
    else:
        try:
            with open(path, "rb") as fh:
                fh.seek(0, 2)
                size = fh.tell()
                fh.seek(max(0, size - MAX_LOG_BYTES))
                data = fh.read()
        except FileNotFoundError:
            raise UserError(path, "LOG", "no such file",
                            "pass a traceback or CI log file, or - to read stdin") from None
        except IsADirectoryError:
            raise UserError(path, "LOG", "is a directory", "pass a log file, e.g. a rank's rank0.log") from None
        except OSError as exc:
            raise UserError(path, "LOG", f"cannot be read ({exc.strerror})",
                            "check the path and its permissions") from None
    cut = len(data) > MAX_LOG_BYTES
    return data[-MAX_LOG_BYTES:].decode("utf-8", errors="replace"), cut


class ExplainCommand(Command):
    name = "explain"
    help = "say which documented failure a traceback or CI log shows, what was measured about it, and the workarounds"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("log", metavar="LOG", help="a traceback or CI log file; - reads stdin")
        versions = parser.add_mutually_exclusive_group()
        versions.add_argument("--freeze", type=Path, metavar="FILE",
                              help="your installed versions, as 'pip freeze' writes them")
        versions.add_argument("--installed", action="store_true",
                              help="your installed versions are those of the interpreter running this command")
        parser.add_argument("--costs", type=Path, metavar="FILE",
                            help="what each workaround costs, a costs.json from 'costs' (default: the newest one "
                            "under --reports-dir)")
        options.add_cli_options(parser, ("reports_dir", "matrix", "repros_dir"))

    def run(self, args: argparse.Namespace, console: Console, argv: Sequence[str]) -> int:
        text, cut = read_log(args.log)
        versions: dict[str, str] | None = None
        if args.freeze is not None:
            try:
                versions = from_freeze(args.freeze.read_text(encoding="utf-8", errors="replace"))
            except OSError as exc:
                raise UserError(args.freeze, "--freeze", f"cannot be read ({exc.strerror})",
                                "pass the file 'pip freeze > FILE' wrote") from None
            if not versions:
                raise UserError(args.freeze, "--freeze", "lists no pinned package", "pass the output of 'pip freeze'")
        elif args.installed:
            versions = here()
        costs_path = args.costs or newest_costs(args.reports_dir)
        entries = read_costs(costs_path) if costs_path is not None else []
        discovery = discover([*options.check_repros_dirs(args.repros_dir), *_matrix_dirs(args.matrix)])
        errors = logged_errors(text)
        found = explain(errors, list(discovery.repros.values()))

        def say(line: str = "") -> None:
            console.print(plain(line), highlight=False, markup=False)

        if cut:
            say(f"(read the last {MAX_LOG_BYTES >> 20} MiB of {args.log})")
        _report(found, say, versions, entries, costs_path)
        return 0 if found.found else 1


def _matrix_dirs(given: Path | None) -> tuple[Path, ...]:
    """The repro directories a matrix names, where there is a matrix (explain needs none)."""
    try:
        return declared_repros_dirs(options.find_matrix(given))
    except options.NoMatrix:
        return ()


Say = Callable[..., None]


def _report(
    found: Explanation,
    say: Say,
    versions: Mapping[str, str] | None,
    entries: Sequence[Mapping[str, Any]],
    costs_path: Path | None,
) -> None:
    if not found.errors:
        say("no exception found in the log (no traceback, no 'Type: message' line): not a documented failure")
        return
    if not found.matches:
        say("not a documented failure.")
        say(f"exceptions in the log: {', '.join(f'{e.type} (line {e.line})' for e in found.errors)}")
        if found.candidates:
            say("closest candidates:")
            for m in found.candidates:
                say(f"  {m.repro.id} ({m.signature.id}): {m.repro.spec.title}")
                say(f"    {m.why}; log line {m.error.line}: {m.error.type}: {m.error.first_line[:160]}")
        return
    for number, m in enumerate(found.matches):
        if number:
            say()
        spec = m.repro.spec
        kind = "a documented failure" if m.repro.builtin else f"your repro ({m.repro.module})"
        certainty = "" if m.status == DOCUMENTED else " (probable)"
        say(f"{spec.id}{certainty}: {spec.title} - {kind}")
        ranks = f", {m.error.streams} ranks" if m.error.streams > 1 else ""
        say(f"  matched {m.signature.id} on log line {m.error.line}{ranks}: {m.error.type}: {m.error.first_line[:200]}")
        if m.why:
            say(f"  {m.why}")
        if spec.upstream:
            say(f"  upstream: {', '.join(spec.upstream)}")
        say("  measured by the harness:")
        for line in measured_lines(spec):
            say(f"    {line}")
        if versions is not None:
            for line in versions_line(spec, versions):
                say(f"  {line}")
        _workarounds(m, say, versions, entries, costs_path)


def _workarounds(
    m: SignatureMatch,
    say: Say,
    versions: Mapping[str, str] | None,
    entries: Sequence[Mapping[str, Any]],
    costs_path: Path | None,
) -> None:
    spec = m.repro.spec
    if not m.repro.builtin:
        declared = m.repro.rank_params.get(PARAM) or {}
        fixed = declared.get("fixed")
        if fixed:
            say(f"  your workaround (its fixed mode): {' '.join([fixed['script_text'], *fixed['args']])}")
            for e in (e for e in spec.expectations if e.mode == "fixed"):
                say(f"    measured {e.outcome} where {', '.join(f'{k}{v}' for k, v in e.when.items()) or 'observed'}")
        return
    say("  workarounds:")
    for line in guard_lines(spec.id, versions):
        say(f"    {line}")
    if costs_path is None:
        say(f"    what each costs is not measured yet: {program_text()} costs --repros {spec.id} "
            "(then pass its costs.json with --costs)")
        return
    say(f"    measured costs ({costs_path}; x the documented configuration where it trains):")
    for line in cost_lines(spec, entries):
        say(f"      {line}")
