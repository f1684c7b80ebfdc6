"""``atlas build``: every documented failure, its claims and boundaries, from the catalog and the runs given.

``assemble`` is the one place an atlas is made: ``atlas build`` writes it (``atlas.json``, ``index.html``, and
an issue text per culprit a watch night named), ``atlas check`` answers from it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path

from harness import __version__
from harness.analysis.atlas.check import check_stack, where_of
from harness.analysis.atlas.derive import (
    catalog_boundaries,
    drawn_boundaries,
    mark_contradictions,
    merged,
    with_observations,
)
from harness.analysis.atlas.evidence import Sources, read_sources
from harness.analysis.atlas.expectations import catalog_claims
from harness.analysis.atlas.html import SurveyedStack, write_page
from harness.analysis.atlas.issues import write_issues
from harness.analysis.atlas.model import ATLAS_FILE, AtlasFile, FailureEntry, write_atlas
from harness.analysis.atlas.survey import in_survey_order, load_survey
from harness.analysis.explain.match import cost_lines, guard_lines
from harness.config.repros import Discovery, Repro
from harness.reports.cost_table import CostEntry


def failure_entry(repro: Repro, sources: Sources, costs: Sequence[CostEntry]) -> FailureEntry:
    spec = repro.spec
    depends = spec.deciding_packages
    claims = with_observations(
        mark_contradictions([*catalog_claims(repro), *sources.claims.get(spec.id, [])], depends), depends
    )
    drawn = [d for d in sources.drawn if d.failure == spec.id]
    mine = [e for e in costs if e.repro == spec.id]
    return FailureEntry(
        id=spec.id,
        title=spec.title,
        depends_on=list(depends),
        depends_on_why=spec.depends_on_why or "not declared: every tracked package may matter",
        impossible_in=dict(spec.impossible_in),
        boundaries=merged([*catalog_boundaries(claims, depends), *drawn_boundaries(drawn, claims)]),
        claims=claims,
        guards=guard_lines(spec.id, None),
        costs=cost_lines(spec, mine) if mine else [],
    )


def assemble(discovery: Discovery, sources: Sources, costs: Sequence[CostEntry] | None = None) -> AtlasFile:
    """The atlas of every failure ``discovery`` found, from its SPEC and what ``sources`` hold."""
    priced = list(costs) if costs is not None else sources.costs
    return AtlasFile(
        built_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        harness_version=__version__,
        sources=["catalog", *sources.names],
        failures=[failure_entry(repro, sources, priced) for repro in discovery.repros.values()],
        notes=sources.notes,
    )


def surveyed_answers(atlas: AtlasFile, discovery: Discovery) -> list[SurveyedStack]:
    """Every stack of the built-in survey and what the atlas answers for it, failure by failure, on a CPU (where
    the evidence ran; on a GPU a CPU's proof answers nothing)."""
    found = []
    for stack in in_survey_order(load_survey()):
        answers = check_stack(atlas, discovery, stack.stack, where_of(stack.stack, "cpu", None, None))
        found.append(SurveyedStack(stack.id, stack.title, stack.source.text(), {a.failure: a.verdict for a in answers}))
    return found


def write_build(out: Path, atlas: AtlasFile, sources: Sources, discovery: Discovery) -> list[Path]:
    """``atlas.json``, ``index.html`` and the issues' texts in ``out``; the paths written."""
    written = [write_atlas(out, atlas), write_page(out, atlas, surveyed_answers(atlas, discovery))]
    written += write_issues(out, sources.changes, atlas)
    return written


def build_atlas(out: Path, directories: Sequence[Path], discovery: Discovery) -> tuple[AtlasFile, list[Path]]:
    sources = read_sources(directories, discovery)
    atlas = assemble(discovery, sources)
    return atlas, write_build(out, atlas, sources, discovery)


def load_atlas(discovery: Discovery, atlas_dir: Path | None, directories: Sequence[Path]) -> AtlasFile:
    """The catalog with what the atlas directory keeps (where it has an ``atlas.json``) and ``directories`` hold."""
    dirs = [atlas_dir] if atlas_dir is not None and (atlas_dir / ATLAS_FILE).is_file() else []
    return assemble(discovery, read_sources([*dirs, *directories], discovery))
