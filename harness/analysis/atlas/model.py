"""``atlas.json``: every documented failure, where each outcome of its ``bug`` mode was proven, and by what.

A **claim** says: the failure's ``bug`` mode ends ``outcome`` wherever the packages it depends on lie in
``when`` (ranges), no further than the releases ``observed`` along each (``regions.py``: between the lowest and
the highest observed inside one stretch of the range; a pin is its own observation), and, for the packages
``when`` does not name, in one of the ``under`` stacks; on ``device`` (the device its evidence ran on; None:
not recorded, and then it answers for no device), at ``world_sizes`` (within the SPEC's), in ``family`` (None:
every family the failure can occur in). Its ``evidence`` is what proved it: the command, the day, the versions
and the outcome. A run's record is a claim of one point (every
package it depends on pinned); an expectation of the catalog is a claim of its range; a bisect claims the
releases on each side of the boundary it found. A later observation inside a claim that saw otherwise is
kept in ``contradicted_by``: the claim is shown as contradicted, never silently replaced.

A **boundary** is what a reader looks for: per package that decides the failure, the last release known bad
and the first known good (null while open upstream), or the last good and the first bad where a release
brought it, the other packages it was proven under, and the evidence. Boundaries are drawn from the claims
(``derive.py``); ``atlas check`` answers from the claims.

The file is written whole (a temporary file renamed over it) and read back validated: a damaged file is
named, never half-trusted.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness.core.errors import UserError
from harness.core.user_files import read_named_text
from harness.records.item import validation_problem

ATLAS_FILE = "atlas.json"
HTML_FILE = "index.html"
SCHEMA_VERSION: Literal[1] = 1
#: The largest ``atlas.json`` read (a few megabytes with a year of nights' evidence).
MAX_ATLAS_BYTES = 256 * 2**20

#: Where a claim comes from: a repro's expectations, a run's record, a bisect, a watch night's culprit.
Source = Literal["catalog", "run", "bisect", "watch"]
#: What an outcome says about a stack: it has the failure, it has not, something else was seen, or nothing.
BAD, GOOD, OTHER, UNOBSERVED = "bad", "good", "other", "unobserved"


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Evidence(Frozen):
    """What proved a claim: one run's observation, a bisect's steps, a catalog expectation's command."""

    command: str
    #: The day it was observed (``YYYY-MM-DD``), where known.
    date: str | None = None
    #: The versions it ran (a run), or the stack the range was established on (the catalog).
    versions: dict[str, str] = Field(default_factory=dict)
    #: The outcome observed, or a bisect's final line.
    outcome: str
    source: Source
    #: The run or bisect directory, or the repro's module.
    where: str = ""
    device: str | None = None
    world_size: int | None = None
    family: str | None = None
    signature: str | None = None
    note: str = ""


class Claim(Frozen):
    outcome: str
    #: Package -> specifier: the range proven along these packages.
    when: dict[str, str] = Field(default_factory=dict)
    #: Package (of ``when``) -> the releases this outcome was observed at: the range answers between the lowest and
    #: the highest of them only. A package ``when`` pins (``==v``) needs none: the pin is what was observed.
    observed: dict[str, list[str]] = Field(default_factory=dict)
    #: Stacks (package -> specifier) the range holds under, for the depended-on packages ``when`` does not name.
    under: list[dict[str, str]] = Field(default_factory=list)
    #: The device its evidence ran on; None: not recorded (it answers for no device).
    device: str | None = None
    world_sizes: str = "any"
    family: str | None = None
    source: Source
    note: str = ""
    evidence: list[Evidence] = Field(default_factory=list)
    contradicted_by: list[Evidence] = Field(default_factory=list)

    @property
    def contradicted(self) -> bool:
        return bool(self.contradicted_by)


class Boundary(Frozen):
    package: str
    #: ``fixed`` (bad, then good), ``introduced`` (good, then bad) or ``open`` (bad, no good release known).
    kind: Literal["fixed", "introduced", "open"]
    last_bad: str | None = None
    first_good: str | None = None
    last_good: str | None = None
    first_bad: str | None = None
    #: The ranges on each side, as the claims say them (None: that side was not proven).
    bad: str | None = None
    good: str | None = None
    #: What else it was proven under: the other packages (specifiers), and the device, world sizes, family and
    #: Python of its evidence.
    under: dict[str, str] = Field(default_factory=dict)
    #: ``proven``, ``contradicted`` (a later run saw otherwise inside it) or ``open upstream``.
    status: Literal["proven", "contradicted", "open upstream"]
    source: Source
    evidence: list[Evidence] = Field(default_factory=list)
    contradicted_by: list[Evidence] = Field(default_factory=list)


class FailureEntry(Frozen):
    id: str
    title: str
    #: The packages whose versions can decide it, and why no other can (empty: not declared).
    depends_on: list[str]
    depends_on_why: str = ""
    #: Families it cannot occur in, with why.
    impossible_in: dict[str, str] = Field(default_factory=dict)
    boundaries: list[Boundary] = Field(default_factory=list)
    claims: list[Claim] = Field(default_factory=list)
    #: The fixed trainer's guards against it, and what each workaround costs where ``costs`` measured it.
    guards: list[str] = Field(default_factory=list)
    costs: list[str] = Field(default_factory=list)


class AtlasFile(Frozen):
    schema_version: Literal[1] = SCHEMA_VERSION
    built_at: str
    harness_version: str | None = None
    #: What it was built from: ``catalog`` and each ``--from`` directory.
    sources: list[str] = Field(default_factory=list)
    failures: list[FailureEntry]
    #: A line for each source that could not be read whole (a results line skipped...).
    notes: list[str] = Field(default_factory=list)

    def failure(self, failure_id: str) -> FailureEntry | None:
        return next((f for f in self.failures if f.id == failure_id), None)


def write_atlas(directory: Path, atlas: AtlasFile) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / ATLAS_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(atlas.model_dump(mode="json"), indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def read_atlas(path: Path) -> AtlasFile:
    """``atlas.json``, validated; a damaged one is a ``UserError`` naming the file and the field."""
    text = read_named_text(path, "", "pass an atlas directory", limit=MAX_ATLAS_BYTES, what="an atlas")
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError):
        raise UserError(path, "", "is not JSON", "build it again: ft-regress atlas build --out DIR") from None
    try:
        return AtlasFile.model_validate(raw)
    except ValidationError as exc:
        raise UserError(path, "", validation_problem(exc), "build it again: ft-regress atlas build --out DIR") from None
