"""One issue text per release a watch night named as a regression's culprit (``DIR/issues/*.md``).

Every change ``watch`` judged ``regressed`` and whose culprit it named, grouped by that release: the first
line of the file is the issue's title (``nightly regression introduced by deepspeed==0.20.0``: the same
release gives the same title every night, so the nightly updates one issue rather than opening another), then
a blank line, then the body: each item that changed, what watch found and how, the boundary the atlas now
holds, and the command that reruns it. The nightly workflow opens the issue, or comments on the open one with
that title.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from harness.analysis.atlas.model import AtlasFile
from harness.records.changes import REGRESSED, Change

ISSUES_DIR = "issues"


def issue_title(package: str, first: str) -> str:
    return f"nightly regression introduced by {package}=={first}"


def _body(package: str, last: str, first: str, night_changes: Sequence[tuple[Path, Change]], atlas: AtlasFile) -> str:
    lines = [
        f"`ft-regress watch` saw {len(night_changes)} item(s) change their outcome with {package} {last} -> "
        f"{first}, and named {package} {first} as the first release with the new outcome.",
        "",
    ]
    for night, change in night_changes:
        signature = f" [{change.after_signature}]" if change.after_signature else ""
        lines.append(f"- `{change.item}`: {change.before} -> {change.after}{signature}")
        lines.append(f"  - {change.reason}")
        final = change.evidence.get("final")
        bisect = change.evidence.get("bisect")
        if final or bisect:
            lines.append(f"  - evidence: {final or ''} ({bisect or night})")
        lines.append(f"  - night: `{night}`")
        entry = atlas.failure(change.repro)
        for boundary in entry.boundaries if entry else []:
            if (
                boundary.source == "watch"
                and boundary.package == package
                and first
                in (
                    boundary.first_bad,
                    boundary.first_good,
                )
            ):
                lines.append(
                    f"  - atlas: {change.repro} {boundary.kind} at {package} {first} ({boundary.status}), under "
                    + ", ".join(f"{k} {v}" for k, v in boundary.under.items())
                )
                break
    lines += ["", "Opened by the nightly workflow from the night's `changes.json`; the atlas page has every boundary."]
    return "\n".join(lines) + "\n"


def write_issues(out: Path, changes: Sequence[tuple[Path, Change]], atlas: AtlasFile) -> list[Path]:
    """The issue texts of the regressions whose culprit watch named; the paths written."""
    by_release: dict[tuple[str, str], list[tuple[Path, Change]]] = defaultdict(list)
    last: dict[tuple[str, str], str] = {}
    for night, change in changes:
        if change.verdict == REGRESSED and change.culprit is not None:
            key = (change.culprit.package, change.culprit.first)
            by_release[key].append((night, change))
            last.setdefault(key, change.culprit.last)
    if not by_release:
        return []
    directory = out / ISSUES_DIR
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for (package, first), found in sorted(by_release.items()):
        slug = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{package}-{first}")
        path = directory / f"{slug}.md"
        body = _body(package, last[(package, first)], first, found, atlas)
        path.write_text(f"{issue_title(package, first)}\n\n{body}", encoding="utf-8")
        written.append(path)
    return written
