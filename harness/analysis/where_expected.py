"""Where each documented failure is expected to reproduce, and where to run clean, cell by cell: each
failure's ``bug`` item in each cell of the ci and nightly lanes that plans it, held to the failure's
expectations at the cell's pinned versions. ``docs/index.md``'s table and ``matrix.yaml``'s header are
rendered from it (``catalog --write``; ``--check`` fails when either is stale), so neither is written by hand.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable
from dataclasses import dataclass

from packaging.utils import canonicalize_name

from harness.analysis.catalog import EVERY_CELL, order_key, when_text
from harness.config.expectations import expectation_for
from harness.config.model import Cell, Matrix
from harness.config.repros import Repro
from harness.planning.items import item_exclusion
from repros.runtime.outcomes import Outcome
from repros.runtime.spec import DEVICES, Expectation, ReproSpec
from repros.trainer.guards import GUARDS

#: The lanes whose cells the pages name (perf repeats the ci cells' stacks; watch floats).
LANES = ("ci", "nightly")


@dataclass(frozen=True)
class Expected:
    """One of a failure's ``bug`` expectations and the cells it holds in (on ``device``, where it names one)."""

    expectation: Expectation
    cells: tuple[Cell, ...]


def _versions(cell: Cell) -> dict[str, str | None]:
    versions: dict[str, str | None] = {
        str(canonicalize_name(k)): v[2:] for k, v in cell.packages.items() if v.startswith("==")
    }
    versions["python"] = cell.python
    return versions


def _cells(matrix: Matrix) -> list[Cell]:
    """The cells the pages name: those of the lanes, pinned, whose packages the harness installs."""
    return [
        c
        for c in matrix.cells.values()
        if any(lane in c.lanes for lane in LANES) and c.installs_packages and not c.floating
    ]


def expected(matrix: Matrix, spec: ReproSpec) -> list[Expected]:
    """``spec``'s ``bug`` expectations, in declared order, each with the cells planning it where it holds."""
    held: dict[int, list[Cell]] = {}
    for cell in _cells(matrix):
        if (cell.repros is not None and spec.id not in cell.repros) or item_exclusion(matrix, cell, spec, "bug"):
            continue
        world_size = spec.world_size or cell.world_size
        for device in DEVICES:
            found = expectation_for(spec, "bug", _versions(cell), device, world_size)
            if found is not None and cell not in held.setdefault(id(found), []):
                held[id(found)].append(cell)
    return [Expected(e, tuple(held[id(e)])) for e in spec.expectations if held.get(id(e))]


def _names(entry: Expected, mark: str) -> str:
    """The cells, ``mark``-quoted, those of the nightly lane alone said so."""
    return ", ".join(f"{mark}{c.name}{mark}" + ("" if "ci" in c.lanes else " (nightly)") for c in entry.cells)


def _when(entry: Expected) -> str:
    exp = entry.expectation
    return when_text(dict(exp.when), exp.device, exp.world_sizes)


def _where(entry: Expected, mark: str = "`") -> str:
    """``when: cells`` (the cells alone where the expectation holds everywhere)."""
    when = _when(entry)
    return _names(entry, mark) if when == EVERY_CELL else f"{when}: {_names(entry, mark)}"


def _outcome_where(entry: Expected, mark: str = "`") -> str:
    """``OUTCOME (when): cells``."""
    when = _when(entry)
    said = entry.expectation.outcome + ("" if when == EVERY_CELL else f" ({when})")
    return f"{said}: {_names(entry, mark)}"


def guards_of(repro_id: str) -> list[str]:
    return [rule.id for rule in GUARDS.values() if rule.works_around_failure(repro_id)]


def index_table(repros: Iterable[Repro], matrix: Matrix) -> str:
    lines = [
        "| id | failure | reproduces | runs clean | otherwise | fixed trainer's guard |",
        "|----|---------|----|----|----|----|",
    ]
    for repro in sorted(repros, key=lambda r: order_key(r.id)):
        entries = expected(matrix, repro.spec)
        by_outcome = {
            kind: "; ".join(_where(e) for e in entries if _kind(e.expectation.outcome) == kind)
            for kind in ("reproduces", "clean")
        }
        otherwise = "; ".join(_outcome_where(e) for e in entries if _kind(e.expectation.outcome) == "otherwise")
        guards = ", ".join(f"`{g}`" for g in guards_of(repro.id)) or "—"
        title = repro.spec.title.replace("|", "\\|")
        lines.append(
            f"| {repro.id} | {title} | {by_outcome['reproduces'] or '—'} | {by_outcome['clean'] or '—'} | "
            f"{otherwise.replace('|', '/') or '—'} | {guards} |"
        )
    return "\n".join(lines)


def _kind(outcome: str) -> str:
    if outcome == Outcome.REPRODUCED:
        return "reproduces"
    if outcome == Outcome.NOT_REPRODUCED:
        return "clean"
    return "otherwise"


def matrix_header(repros: Iterable[Repro], matrix: Matrix) -> str:
    """The matrix's header comment: each failure's cells of the ci and nightly lanes, by expected outcome."""
    lines: list[str] = []
    for repro in sorted(repros, key=lambda r: order_key(r.id)):
        entries = expected(matrix, repro.spec)
        parts = [_outcome_where(e, mark="") for e in entries]
        text = f"{repro.id:<4} " + (" | ".join(parts) if parts else "no cell of the ci or nightly lane expects it")
        lines += textwrap.wrap(text, 114, subsequent_indent="       ", break_on_hyphens=False, break_long_words=False)
    return "\n".join(f"#   {line}" for line in lines)
