"""``atlas export --format osv``: one OSV record (https://ossf.github.io/osv-schema/) per documented failure, so that
other tools (scanners, dependency bots) can read the atlas.

Each record's ``affected`` has one entry per package that decides the failure (``depends_on``), on PyPI: its
``versions`` are the releases proven bad (``coverage.py``: every release a run, a range's observation or a
stack it was proven under names), its ``ECOSYSTEM`` ranges the stretches one claim proved bad along that
package's own range, each from its lowest observed release (``introduced``) to the first good release of a
boundary drawn right after it (``fixed``) or, where none is, to its highest (``last_affected``): never further
than runs proved. A
release may be proven bad in one combination and good in another (``proven_good`` lists it too).

An OSV range holds for one package alone; the atlas's claims hold for combinations, so each entry's
``database_specific`` names, per bad release, the other packages it was proven bad under, and the record's
``database_specific.combinations`` holds every claim (its ranges, the stacks it was proven under, device,
world sizes, family, evidence's commands).

Every record is checked against OSV's own schema before it is written (``osv.schema.json``, OSV schema 1.7.5,
vendored with its licence, ``osv.schema.LICENSE``, Apache-2.0), save its registry of home databases: an id
starts with a registered database's prefix there, and the atlas is not one (its ids are ``FTR-F1``...).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema

from harness.analysis.atlas.coverage import coverage, stretches
from harness.analysis.atlas.model import AtlasFile, Claim, FailureEntry
from harness.config.repros import Discovery

OSV_SCHEMA_VERSION = "1.7.5"
#: The prefix of the atlas's record ids (``FTR-F1``).
ID_PREFIX = "FTR"
_REFERENCE = re.compile(r"^(?P<repo>[\w.-]+/[\w.-]+)(?:#| PR #)(?P<number>\d+)")


def osv_schema(registered_prefixes_only: bool = False) -> dict[str, Any]:
    """OSV's schema; unless ``registered_prefixes_only``, an id may start with any database's prefix."""
    text = resources.files("harness.analysis.atlas").joinpath("osv.schema.json").read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    if not registered_prefixes_only:
        schema["$defs"]["prefix"] = {"type": "string", "pattern": "^[A-Z][A-Z0-9]*-"}
    return schema


def _timestamp(text: str) -> str:
    """An RFC 3339 UTC time as OSV writes it (``2026-11-29T03:00:00Z``)."""
    return text.replace("+00:00", "Z") if text.endswith("+00:00") else text


def _references(upstream: tuple[str, ...]) -> list[dict[str, str]]:
    refs = []
    for text in upstream:
        match = _REFERENCE.match(text)
        if match is None:
            continue
        kind = "pull" if " PR #" in text else "issues"
        refs.append(
            {
                "type": "FIX" if "fix" in text.lower() and kind == "pull" else "REPORT",
                "url": f"https://github.com/{match['repo']}/{kind}/{match['number']}",
            }
        )
    return refs


def _combination(claim: Claim) -> dict[str, Any]:
    return {
        "outcome": claim.outcome,
        "when": claim.when,
        "observed": claim.observed,
        "under": claim.under,
        "device": claim.device,
        "world_sizes": claim.world_sizes,
        "family": claim.family,
        "source": claim.source,
        "evidence": [e.command for e in claim.evidence],
        "contradicted_by": [e.command for e in claim.contradicted_by],
    }


def record(entry: FailureEntry, atlas: AtlasFile, upstream: tuple[str, ...] = ()) -> dict[str, Any]:
    """The OSV record of one failure."""
    affected = []
    for covered in coverage(entry):
        if not covered.bad:
            continue
        events_list = []
        for first, fixed, last in stretches(covered.bad_stretches):
            end = {"fixed": fixed} if fixed is not None else {"last_affected": last}
            events_list.append({"type": "ECOSYSTEM", "events": [{"introduced": first}, end]})
        affected.append(
            {
                "package": {"ecosystem": "PyPI", "name": covered.package, "purl": f"pkg:pypi/{covered.package}"},
                "ranges": events_list,
                "versions": list(covered.bad),
                "database_specific": {
                    "proven_good": list(covered.good),
                    "other_outcome": list(covered.other),
                    "bad_under": covered.bad_under,
                },
            }
        )
    return {
        "schema_version": OSV_SCHEMA_VERSION,
        "id": f"{ID_PREFIX}-{entry.id}",
        "modified": _timestamp(atlas.built_at),
        "summary": entry.title,
        "details": f"Decided by {', '.join(entry.depends_on)}: {entry.depends_on_why}. Ranges are releases proven "
        "by runs; they hold only under the combinations in database_specific.",
        "affected": affected,
        "references": _references(upstream),
        "database_specific": {
            "depends_on": entry.depends_on,
            "boundaries": [
                b.model_dump(mode="json", exclude={"evidence", "contradicted_by"}) for b in entry.boundaries
            ],
            "combinations": [_combination(c) for c in entry.claims],
            "source": f"ft-regress {atlas.harness_version or ''} atlas built {atlas.built_at}".replace("  ", " "),
        },
    }


def check_record(data: Mapping[str, Any]) -> None:
    """Raise ``jsonschema.ValidationError`` where ``data`` is not an OSV record."""
    jsonschema.Draft202012Validator(osv_schema(), format_checker=jsonschema.FormatChecker()).validate(data)


def write_osv(out: Path, atlas: AtlasFile, discovery: Discovery) -> list[Path]:
    """One ``FTR-<id>.json`` per failure in ``out``, each checked against OSV's schema first."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for entry in atlas.failures:
        repro = discovery.repros.get(entry.id)
        data = record(entry, atlas, repro.spec.upstream if repro else ())
        check_record(data)
        path = out / f"{data['id']}.json"
        path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        written.append(path)
    return written
