"""The claims runs make, read from the directories ``--from`` names.

- a run (``results.jsonl``; ``run``, ``check``, a nightly shard or merge, a ``--prove``): each ``bug`` record
  of a documented scenario is a claim of one point, every package the failure depends on at the version its
  ranks imported (``run.json``'s listing for a package records do not carry); a crosscheck record is one for
  each documented failure that makes its strategy diverge (a divergence it names, or an agreement), and a
  divergence nobody documented is kept as a note (a finding);
- a bisect (``bisect.json``): where it found a boundary, the releases it ran on each side of it, under the
  base cell's other packages, and the boundary itself; its steps are points too;
- a watch night (``changes.json``): for each change whose release watch named (its culprit), the last
  release with the old outcome and the first with the new, under tonight's other packages; its bisect where
  the directory still holds it; tonight's records are points;
- an atlas (``atlas.json``): every claim it kept from runs (the catalog's are read from the SPECs afresh);
- ``costs.json`` anywhere among them: what each workaround costs.

A directory holding none of these is a ``UserError``; a record line that cannot be read (a torn last line, a
line that is no record) is left out and named in the atlas's notes, with how many records that drops and why.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from harness.analysis.atlas.model import ATLAS_FILE, BAD, GOOD, UNOBSERVED, Boundary, Claim, Evidence, read_atlas
from harness.analysis.atlas.regions import public, verdict_of
from harness.config.repros import Discovery
from harness.core.errors import UserError
from harness.core.invocation import program_text
from harness.core.user_files import read_named_text
from harness.records.bisect import BISECT_FILE, FOUND, BisectReport
from harness.records.changes import CHANGES_FILE, Change, ChangesFileError, read_changes
from harness.records.costs import COSTS_FILE, read_costs
from harness.records.item import ItemRecord
from harness.records.results import read_results
from harness.records.run_dir import RESULTS_FILE, RunDir
from harness.records.run_meta import RunMeta
from harness.reports.cost_table import CostEntry
from repros.runtime.outcomes import Outcome
from repros.runtime.stack_failure import DOES_NOT_IMPORT

#: The largest ``bisect.json`` read.
MAX_BISECT_BYTES = 64 * 2**20


@dataclass
class Drawn:
    """A boundary a bisect or a watch night found, with the claims on its two sides."""

    failure: str
    boundary: Boundary
    claims: tuple[Claim, ...]


@dataclass
class Sources:
    names: list[str] = field(default_factory=list)
    #: Failure id -> claims of runs (points, and the sides of bisects and culprits).
    claims: dict[str, list[Claim]] = field(default_factory=lambda: defaultdict(list))
    drawn: list[Drawn] = field(default_factory=list)
    costs: list[CostEntry] = field(default_factory=list)
    #: Each watch night's changes, with the night's directory (the nightly's issues).
    changes: list[tuple[Path, Change]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, failure: str, claim: Claim) -> None:
        if claim not in self.claims[failure]:
            self.claims[failure].append(claim)


def _date(record: ItemRecord) -> str | None:
    return (record.finished_at or record.started_at or "")[:10] or None


def _record_versions(record: ItemRecord, meta: RunMeta) -> dict[str, str]:
    """What the record's ranks imported, and the rest of its cell's listing (``trl``, ``kernels``...)."""
    listed = {k: v for k, v in meta.cell_versions(record.cell).items() if v}
    imported = {k: v for k, v in record.versions.items() if v}
    return {**listed, **imported}


def record_evidence(
    record: ItemRecord, where: Path, versions: Mapping[str, str], depends_on: Iterable[str]
) -> Evidence:
    """A record as evidence: its command, day, versions (its own, and the depended-on packages of its cell's
    listing), outcome and where it ran."""
    extra = set(depends_on)
    return Evidence(
        command=record.repro_cmd,
        date=_date(record),
        versions={k: v for k, v in versions.items() if k in record.versions or k in extra},
        outcome=str(record.outcome),
        source="run",
        where=str(where),
        device=record.device,
        world_size=record.world_size,
        family=record.family,
        signature=record.signature,
    )


def does_not_import(record: ItemRecord) -> str | None:
    """Why the record's stack could not run at all, where a package of it does not import (its reason)."""
    if record.outcome != Outcome.INFRA:
        return None
    return next((r for r in record.reasons if DOES_NOT_IMPORT in r), None)


def point(
    record: ItemRecord, meta: RunMeta, depends_on: Sequence[str], where: Path, crosscheck: bool = False
) -> Claim | None:
    """A ``bug`` record of the documented scenario (or a crosscheck record read as one) as a claim of one point
    (None: it observed nothing). A stack a package of which does not import observed nothing either, but is a
    point all the same (INFRA, its reason its note): a property of the stack on that device, said as such, not a
    question a run there could settle."""
    if record.mode != "bug" or record.variant is not None or record.scenario is not None:
        return None
    if record.kind == "crosscheck" and not crosscheck:
        return None
    broken = does_not_import(record)
    if verdict_of(record.outcome) == UNOBSERVED and broken is None:
        return None
    versions = _record_versions(record, meta)
    when = {p: f"=={public(versions[p])}" for p in depends_on if versions.get(p)}
    return Claim(
        outcome=str(record.outcome),
        when=when,
        under=[{}],
        device=record.device,
        world_sizes=f"=={record.world_size}",
        family=record.family,
        source="run",
        note=broken or "",
        evidence=[record_evidence(record, where, versions, depends_on)],
    )


def crosscheck_claims(record: ItemRecord, meta: RunMeta, discovery: Discovery, where: Path) -> list[tuple[str, Claim]]:
    """A crosscheck record as evidence of the documented failures that make its strategy diverge (their SPEC's
    ``diverges``): a divergence one of them names is that failure observed (REPRODUCED), an agreement is its
    absence (NOT_REPRODUCED), each at the record's versions."""
    if record.kind != "crosscheck" or record.strategy is None or verdict_of(record.outcome) == UNOBSERVED:
        return []
    found: list[tuple[str, Claim]] = []
    for repro in discovery.repros.values():
        spec = repro.spec
        if not any(where.names(record.strategy) for where in spec.diverges):
            continue
        named = record.signature is not None and any(s.id == record.signature for s in spec.signatures)
        if record.outcome == Outcome.AGREES:
            outcome = Outcome.NOT_REPRODUCED
        elif record.outcome == Outcome.DIVERGES and named:
            outcome = Outcome.REPRODUCED
        else:
            continue  # it diverged otherwise: not this failure's evidence either way
        claim = point(record.evolve(mode="bug", outcome=outcome), meta, spec.deciding_packages, where, crosscheck=True)
        if claim is not None:
            found.append((spec.id, claim))
    return found


def _read_run(path: Path, discovery: Discovery, sources: Sources) -> list[ItemRecord]:
    run = RunDir(path)
    records = read_results(run.results_path, lenient=True)
    # Nothing left out in silence: each line not read as a record is a note of the atlas, with why.
    sources.notes.extend(records.skipped)
    if records.torn is not None:
        sources.notes.append(f"{records.torn.describe()}: 1 record left out of the atlas")
    sources.notes.extend(records.duplicates)
    meta = run.read_meta()
    for record in records:
        for failure, kept in crosscheck_claims(record, meta, discovery, path):
            sources.add(failure, kept)
        if record.kind == "crosscheck" and record.outcome == Outcome.DIVERGES and record.signature is None:
            sources.notes.append(
                f"{path}: {record.cell}/{record.strategy} trains unlike one process, named by no documented failure "
                f"(a finding; rerun: {record.repro_cmd})"
            )
        repro = discovery.repros.get(record.repro)
        if repro is None:
            continue
        claim = point(record, meta, repro.spec.deciding_packages, path)
        if claim is not None:
            sources.add(record.repro, claim)
    return list(records)


def _bisect_command(report: BisectReport, extra: Mapping[str, object]) -> str:
    cell = extra.get("base_cell")
    matrix = extra.get("matrix")
    words = [program_text(), "bisect", "--repro", report.repro, "--mode", report.mode]
    words += ["--package", str(report.package), "--good", report.good, "--bad", report.bad]
    if matrix:
        words += ["--matrix", str(matrix)]
    if cell:
        words += ["--cells", str(cell)]
    return " ".join(words)


def _read_bisect(path: Path, discovery: Discovery, sources: Sources, source: str = "bisect") -> None:
    """A bisect's boundary and the claims on its two sides; its steps' records as points."""
    file = path / BISECT_FILE
    raw = read_named_text(file, "", "pass a bisect's directory", limit=MAX_BISECT_BYTES, what="a bisect's report")
    try:
        report = BisectReport.model_validate_json(raw)
    except (ValueError, ValidationError) as exc:
        raise UserError(
            file, "", f"is not a bisect's report ({str(exc).splitlines()[0]})", "pass a bisect's directory"
        ) from None
    steps = _read_run(path, discovery, sources) if (path / RESULTS_FILE).is_file() else []
    repro = discovery.repros.get(report.repro)
    if (
        repro is None
        or report.mode != "bug"
        or report.axis != "version"
        or report.package is None
        or report.status != FOUND
        or report.boundary is None
    ):
        sources.notes.append(f"{path}: {report.final} (no boundary of a documented failure's bug mode to keep)")
        return
    before = report.before_boundary()
    by_point = {r.bisect_point: r for r in steps if r.bisect_point}
    at, beside = by_point.get(report.boundary), by_point.get(before or "")
    if before is None or at is None or beside is None:
        sources.notes.append(f"{path}: the records of its boundary's steps are missing; only its points are kept")
        return
    package = report.package
    meta = RunDir(path).read_meta()
    versions = _record_versions(at, meta)
    depends = repro.spec.deciding_packages
    held = {p: f"=={public(versions[p])}" for p in depends if p != package and versions.get(p)}
    extra = report.model_extra or {}
    evidence = Evidence(
        command=_bisect_command(report, extra),
        date=_date(at),
        versions=versions,
        outcome=report.final,
        source="watch" if source == "watch" else "bisect",
        where=str(path),
        device=at.device,
        world_size=at.world_size,
        family=at.family,
        signature=str(extra.get("bad_signature", [None, None])[1] or "") or None,
    )
    older, newer = report.points[0], report.points[-1]
    old_side = Claim(
        outcome=str(beside.outcome),
        when={package: f">={older},<={before}"},
        observed={package: [older, before]},
        under=[held],
        device=at.device,
        world_sizes=f"=={at.world_size}",
        family=at.family,
        source=evidence.source,
        evidence=[evidence],
    )
    new_side = old_side.model_copy(
        update={
            "outcome": str(at.outcome),
            "when": {package: f">={report.boundary},<={newer}"},
            "observed": {package: [report.boundary, newer]},
        }
    )
    for claim in (old_side, new_side):
        sources.add(report.repro, claim)
    sources.drawn.append(
        Drawn(
            report.repro,
            _boundary(
                package,
                (str(beside.outcome), before),
                (str(at.outcome), report.boundary),
                {**held, **_scope(at)},
                evidence,
            ),
            (old_side, new_side),
        )
    )


def _boundary(
    package: str,
    old: tuple[str, str],
    new: tuple[str, str],
    under: Mapping[str, str],
    evidence: Evidence,
) -> Boundary:
    """The boundary between ``old`` and ``new`` (each an outcome and the release it was seen at)."""
    (old_outcome, last), (new_outcome, first) = old, new
    old_verdict, new_verdict = verdict_of(old_outcome), verdict_of(new_outcome)
    seen_old, seen_new = f"{old_outcome} at {last}", f"{new_outcome} from {first}"
    if new_verdict == BAD and old_verdict != BAD:
        return Boundary(
            package=package,
            kind="introduced",
            last_good=last if old_verdict == GOOD else None,
            first_bad=first,
            good=seen_old if old_verdict == GOOD else None,
            bad=seen_new,
            under=dict(under),
            status="proven",
            source=evidence.source,
            evidence=[evidence],
        )
    return Boundary(
        package=package,
        kind="fixed",
        last_bad=last if old_verdict == BAD else None,
        first_good=first if new_verdict == GOOD else None,
        bad=seen_old if old_verdict == BAD else None,
        good=seen_new if new_verdict == GOOD else None,
        under=dict(under),
        status="proven",
        source=evidence.source,
        evidence=[evidence],
    )


def _scope(record: ItemRecord) -> dict[str, str]:
    scope = {"device": record.device or "?", "world size": str(record.world_size), "family": record.family}
    python = record.versions.get("python")
    if python:
        scope["python"] = python
    return scope


def _read_watch(path: Path, discovery: Discovery, sources: Sources, tonight: list[ItemRecord]) -> None:
    """A watch night's culprits: the boundary each proved, and its bisect where the directory holds it."""
    try:
        changes = read_changes(path) or []
    except ChangesFileError as exc:
        raise UserError(path / CHANGES_FILE, "", str(exc), "pass a watch night's directory") from None
    meta = RunDir(path).read_meta()
    command = " ".join([meta.program or program_text(), *meta.argv]) if meta.argv else f"{program_text()} watch"
    records = {r.key: r for r in tonight}
    for change in changes:
        sources.changes.append((path, change))
        repro = discovery.repros.get(change.repro)
        if change.culprit is None or change.mode != "bug" or repro is None:
            continue
        bisected = change.evidence.get("bisect")
        if isinstance(bisected, str) and (Path(bisected) / BISECT_FILE).is_file():
            _read_bisect(Path(bisected), discovery, sources, source="watch")
        after = records.get((change.cell, change.repro, change.mode))
        if after is None:
            continue
        package, culprit = change.culprit.package, change.culprit
        versions = _record_versions(after, meta)
        depends = repro.spec.deciding_packages
        held = {p: f"=={public(versions[p])}" for p in depends if p != package and versions.get(p)}
        evidence = Evidence(
            command=command,
            date=_date(after),
            versions=versions,
            outcome=f"{change.verdict}: {change.before} -> {change.after}; {package} {culprit.last} is the last "
            f"release with the old outcome, {culprit.first} the first with the new",
            source="watch",
            where=str(path),
            device=after.device,
            world_size=after.world_size,
            family=after.family,
            signature=change.after_signature,
            note=change.reason,
        )
        sides = tuple(
            Claim(
                outcome=str(outcome),
                when={package: f"=={version}"},
                under=[held],
                device=after.device,
                world_sizes=f"=={after.world_size}",
                family=after.family,
                source="watch",
                evidence=[evidence],
            )
            for outcome, version in ((change.before, culprit.last), (change.after, culprit.first))
        )
        for claim in sides:
            sources.add(change.repro, claim)
        boundary = _boundary(
            package,
            (str(change.before), culprit.last),
            (str(change.after), culprit.first),
            {**held, **_scope(after)},
            evidence,
        )
        sources.drawn.append(Drawn(change.repro, boundary, sides))


def _read_atlas(path: Path, sources: Sources) -> None:
    atlas = read_atlas(path / ATLAS_FILE)
    sources.notes.extend(atlas.notes)
    for failure in atlas.failures:
        for claim in failure.claims:
            if claim.source != "catalog":
                sources.add(failure.id, claim.model_copy(update={"contradicted_by": []}))
        for boundary in failure.boundaries:
            if boundary.source in ("bisect", "watch"):
                sides = tuple(
                    c
                    for c in failure.claims
                    if c.source == boundary.source and any(e in boundary.evidence for e in c.evidence)
                )
                drawn = Drawn(
                    failure.id, boundary.model_copy(update={"status": "proven", "contradicted_by": []}), sides
                )
                if all(d.boundary != drawn.boundary for d in sources.drawn):
                    sources.drawn.append(drawn)


def read_sources(directories: Iterable[Path], discovery: Discovery) -> Sources:
    """Every claim the directories hold (each named in ``names``)."""
    sources = Sources()
    for directory in directories:
        if not directory.is_dir():
            raise UserError(
                "--from", str(directory), "is not a directory", "pass a run, bisect, watch or atlas directory"
            )
        found = False
        if (directory / ATLAS_FILE).is_file():
            _read_atlas(directory, sources)
            found = True
        if (directory / BISECT_FILE).is_file():
            _read_bisect(directory, discovery, sources)
            found = True
        elif (directory / RESULTS_FILE).is_file():
            tonight = _read_run(directory, discovery, sources)
            if (directory / CHANGES_FILE).is_file():
                _read_watch(directory, discovery, sources, tonight)
            found = True
        if (directory / COSTS_FILE).is_file():
            sources.costs.extend(read_costs(directory / COSTS_FILE))
            found = True
        if not found:
            raise UserError(
                "--from",
                str(directory),
                f"holds no {RESULTS_FILE}, {BISECT_FILE}, {CHANGES_FILE}, {COSTS_FILE} or {ATLAS_FILE}",
                "pass the directory of a run, a bisect, a watch night or an atlas",
            )
        sources.names.append(str(directory))
    return sources
