"""What ``explain`` prints: for each documented failure a log shows, what the harness measured
about it, where the user's versions fall, and each workaround with what it costs; or "not a
documented failure" with the closest candidates."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from rich.console import Console

from harness.analysis.explain.installed import from_freeze, here
from harness.analysis.explain.logs import MAX_ERRORS, open_log, scan_log
from harness.analysis.explain.match import (
    DOCUMENTED,
    Explanation,
    SignatureMatch,
    cost_lines,
    explain,
    guard_lines,
    measured_lines,
    versions_line,
)
from harness.config.locate import NoMatrix, find_matrix
from harness.config.matrix import declared_repros_dirs
from harness.config.repros import discover
from harness.core.errors import UserError
from harness.core.invocation import program_text
from harness.core.text import plain
from harness.records.costs import newest_costs, read_costs
from harness.reports.cost_table import CostEntry
from repros.runtime.kinds.script import PARAM


def run_explain(
    log: str,
    freeze: Path | None,
    installed: bool,
    costs: Path | None,
    reports_dir: Path,
    matrix: Path | None,
    repros_dirs: Sequence[Path],
    console: Console,
) -> int:
    """Explain ``log`` on the console; 0 when it shows a documented failure, 1 when not."""
    with open_log(log) as lines:
        scan = scan_log(lines)  # the whole log, line by line
    versions: dict[str, str] | None = None
    if freeze is not None:
        versions = from_freeze(freeze)
        if not versions:
            raise UserError(freeze, "--freeze", "lists no pinned package", "pass the output of 'pip freeze'")
    elif installed:
        versions = here()
    costs_path = costs or newest_costs(reports_dir)
    entries = read_costs(costs_path) if costs_path is not None else []
    discovery = discover([*repros_dirs, *_matrix_dirs(matrix)])
    found = explain(scan.errors, list(discovery.repros.values()))

    def say(line: str = "") -> None:
        console.print(plain(line), highlight=False, markup=False)

    _report(found, say, versions, entries, costs_path)
    if scan.not_kept:
        say(f"({scan.not_kept} more distinct exceptions in the log's {scan.lines} lines beyond the first {MAX_ERRORS})")
    return 0 if found.found else 1


def _matrix_dirs(given: Path | None) -> tuple[Path, ...]:
    """The repro directories a matrix names, where there is a matrix (explain needs none)."""
    try:
        return declared_repros_dirs(find_matrix(given))
    except NoMatrix:
        return ()


Say = Callable[..., None]


def _report(
    found: Explanation,
    say: Say,
    versions: Mapping[str, str] | None,
    entries: Sequence[CostEntry],
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
        advice = m.signature.advice(m.error.message) if m.signature.advice else None
        if advice:
            say(f"  what to write instead: {advice}")
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
    entries: Sequence[CostEntry],
    costs_path: Path | None,
) -> None:
    spec = m.repro.spec
    if not m.repro.builtin:
        declared = m.repro.rank_params.get(PARAM)
        fixed = declared.get("fixed") if isinstance(declared, dict) else None
        if isinstance(fixed, dict):
            say(f"  your workaround (its fixed mode): {' '.join([fixed['script_text'], *fixed['args']])}")
            for e in (e for e in spec.expectations if e.mode == "fixed"):
                say(f"    measured {e.outcome} where {', '.join(f'{k}{v}' for k, v in e.when.items()) or 'observed'}")
        return
    say("  workarounds:")
    for line in guard_lines(spec.id, versions):
        say(f"    {line}")
    if costs_path is None:
        say(
            f"    what each costs is not measured yet: {program_text()} costs --repros {spec.id} "
            "(then pass its costs.json with --costs)"
        )
        return
    say(f"    measured costs ({costs_path}; x the documented configuration where it trains):")
    for line in cost_lines(spec, entries):
        say(f"      {line}")
