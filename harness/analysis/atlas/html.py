"""The atlas as a page (``index.html``): self-contained (styles and figures inline, nothing fetched), readable at a
glance: a picture per package of where each failure is there and where it is not, then the ground covered (per
failure and package, the releases proven bad, proven good, or not yet known, and which surveyed stacks are
affected), then each package's boundaries with what they were proven under and the evidence, then each failure
with its claims.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from markupsafe import Markup
from packaging.version import InvalidVersion, Version

from harness.analysis.atlas.coverage import coverage
from harness.analysis.atlas.model import (
    BAD,
    GOOD,
    HTML_FILE,
    OTHER,
    UNOBSERVED,
    AtlasFile,
    Boundary,
    Claim,
    FailureEntry,
)
from harness.analysis.atlas.regions import contains, point_where, verdict_of
from harness.core.names import natural_key
from harness.reports import pages
from harness.reports.plots import STYLE, figure, svg_text
from repros.runtime.spec import TRACKED_PACKAGES

#: The most releases of one package a figure draws (the nearest to the boundaries when there are more).
MAX_RELEASES = 40
#: Where ranges of the failure say both, another package decides (the table says which).
MIXED = "mixed"
_COLOURS = {BAD: "#d9534f", GOOD: "#5cb85c", OTHER: "#f0ad4e", MIXED: "#b8b8b8", UNOBSERVED: "#e6e6f0"}


def _key(version: str) -> Version:
    try:
        return Version(version)
    except InvalidVersion:
        return Version("0")


def boundary_text(boundary: Boundary) -> str:
    if boundary.kind == "fixed":
        return f"last bad {boundary.last_bad or '?'} → first good {boundary.first_good or '?'}"
    if boundary.kind == "introduced":
        return f"last good {boundary.last_good or '?'} → first bad {boundary.first_bad or '?'}"
    return f"open upstream (last bad {boundary.last_bad or '?'})"


def _packages(atlas: AtlasFile) -> list[str]:
    named = {b.package for f in atlas.failures for b in f.boundaries}
    return [p for p in TRACKED_PACKAGES if p in named] + sorted(named - set(TRACKED_PACKAGES))


def _releases(entries: Sequence[FailureEntry], package: str) -> list[str]:
    """The releases of ``package`` the boundaries and the runs name, oldest first."""
    edges: set[str] = set()
    observed: set[str] = set()
    for entry in entries:
        for b in entry.boundaries:
            if b.package == package:
                edges |= {v for v in (b.last_bad, b.first_good, b.last_good, b.first_bad) if v}
        for claim in entry.claims:
            if claim.source == "run":
                version = point_where(claim).versions.get(package)
                if version:
                    observed.add(version)
    # A range's edge written as a pre-release (``<5.0.0.dev0``) is not a release anyone installs; one release
    # written two ways (``5.23``, ``5.23.0``) is one column.
    by_release: dict[Version, str] = {}
    for version in sorted(observed) + sorted(edges):
        key = _key(version)
        if key.is_prerelease and version not in observed:
            continue
        by_release.setdefault(key, version)
    ordered = [by_release[k] for k in sorted(by_release)]
    if len(ordered) > MAX_RELEASES:
        ordered = ordered[-MAX_RELEASES:]
    return ordered


def _state(claims: Sequence[Claim], package: str, version: str) -> tuple[str | None, bool]:
    """What the ranges (not the points) say at ``version`` of ``package`` (along the package, or where the stacks
    a claim was proven under hold it), and whether one is contradicted."""
    verdicts = set()
    contradicted = False
    for claim in claims:
        if claim.source == "run":
            continue
        if package in claim.when:
            holds = contains(claim.when[package], version)
        else:  # held by the stacks it was proven under
            holds = any(package in stack and contains(stack[package], version) for stack in claim.under)
        if not holds:
            continue
        verdicts.add(verdict_of(claim.outcome))
        contradicted |= claim.contradicted
    if len(verdicts) > 1:
        verdicts.discard(UNOBSERVED)  # what observed nothing says nothing beside what observed something
    if not verdicts:
        return None, contradicted
    if verdicts == {BAD, GOOD}:
        return MIXED, contradicted
    if len(verdicts) > 1:
        return OTHER, contradicted
    return verdicts.pop(), contradicted


def package_figure(atlas: AtlasFile, package: str) -> Markup | None:
    """Failures (rows) by releases of ``package`` (columns): red where a range says the failure is there, green
    where it says it is not, hatched where a run contradicted it; a dot where a run observed it."""
    entries = [f for f in atlas.failures if any(b.package == package for b in f.boundaries)]
    releases = _releases(entries, package)
    if not entries or not releases:
        return None
    import matplotlib
    from matplotlib.patches import Patch

    with matplotlib.rc_context(STYLE):
        fig, (ax,) = figure(max(6.0, 2.5 + 0.42 * len(releases)), 1.0 + 0.38 * len(entries), columns=1)
        for row, entry in enumerate(entries):
            for column, version in enumerate(releases):
                state, contradicted = _state(entry.claims, package, version)
                if state is not None:
                    ax.barh(
                        row,
                        0.92,
                        left=column - 0.46,
                        height=0.7,
                        color=_COLOURS[state],
                        hatch="///" if contradicted else None,
                        edgecolor="black" if contradicted else _COLOURS[state],
                        linewidth=0.5,
                    )
            for claim in entry.claims:
                seen = point_where(claim).versions.get(package) if claim.source == "run" else None
                if seen is not None and seen in releases and verdict_of(claim.outcome) in _COLOURS:
                    ax.plot(releases.index(seen), row, "o", color="black", markersize=3.5)
        ax.set_yticks(range(len(entries)), [f"{e.id}" for e in entries])
        ax.set_xticks(range(len(releases)), releases, rotation=60, ha="right")
        ax.set_xlim(-0.6, len(releases) - 0.4)
        ax.invert_yaxis()
        ax.set_xlabel(f"{package} release")
        ax.legend(
            handles=[
                Patch(color=_COLOURS[BAD], label="failure there (range)"),
                Patch(color=_COLOURS[GOOD], label="not there (range)"),
                Patch(color=_COLOURS[OTHER], label="another outcome"),
                Patch(color=_COLOURS[MIXED], label="another package decides"),
                Patch(color=_COLOURS[UNOBSERVED], label="cannot run here (INFRA)"),
                Patch(facecolor="white", edgecolor="black", hatch="///", label="contradicted by a run"),
            ],
            loc="upper left",
            bbox_to_anchor=(1.0, 1.0),
            fontsize=7,
            frameon=False,
        )
        return Markup(svg_text(fig))


@dataclass(frozen=True)
class SurveyedStack:
    """A surveyed stack as the page shows it: its id, title, where it came from, and the atlas's answer per failure."""

    id: str
    title: str
    source: str
    verdicts: Mapping[str, str]


def ground_covered(atlas: AtlasFile, surveyed: Sequence[SurveyedStack]) -> list[dict[str, object]]:
    """Per failure: per package that decides it, the releases proven bad, proven good, or where something else was
    seen (everything else not yet known); and the surveyed stacks it is proven there for, not there for, unknown."""
    rows = []
    for entry in atlas.failures:
        by_verdict: dict[str, list[str]] = {}
        for stack in surveyed:
            by_verdict.setdefault(stack.verdicts.get(entry.id, "unknown"), []).append(stack.id)
        rows.append({"entry": entry, "packages": coverage(entry), "stacks": by_verdict})
    return rows


def render_page(atlas: AtlasFile, surveyed: Sequence[SurveyedStack] = ()) -> str:
    packages = _packages(atlas)
    by_package = {
        p: sorted(
            ((f, b) for f in atlas.failures for b in f.boundaries if b.package == p),
            key=lambda fb: natural_key(fb[0].id),
        )
        for p in packages
    }
    counts = {
        "failures": len(atlas.failures),
        "boundaries": sum(len(f.boundaries) for f in atlas.failures),
        "contradicted": sum(1 for f in atlas.failures for b in f.boundaries if b.status == "contradicted"),
        "open": sum(1 for f in atlas.failures if any(b.status == "open upstream" for b in f.boundaries)),
    }
    return pages.render_page(
        "atlas.html.j2",
        atlas=atlas,
        boundary_text=boundary_text,
        packages=packages,
        by_package=by_package,
        figures={p: package_figure(atlas, p) for p in packages},
        counts=counts,
        verdict_of=verdict_of,
        covered=ground_covered(atlas, surveyed),
        surveyed=surveyed,
    )


def write_page(out: Path, atlas: AtlasFile, surveyed: Sequence[SurveyedStack] = ()) -> Path:
    path = out / HTML_FILE
    tmp = path.with_suffix(".html.tmp")
    tmp.write_text(render_page(atlas, surveyed), encoding="utf-8")
    tmp.replace(path)
    return path
