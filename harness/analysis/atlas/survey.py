"""The stacks people run, kept as data with where each came from (``survey.yaml``, checked by ``survey.schema.json``).

A surveyed stack is what a peer project pinned at a release tag, what an issue the catalog cites reported, or the
newest releases of a month: its ``requires`` (the requirement lines of the packages the documented failures depend
on, as its file writes them), its ``stack`` (the release of each such package: the file's pin, or what the lines
resolved to as of ``resolved_as_of``), and its source (repository, tag or issue, commit, file, day). ``atlas
survey`` proves what the atlas cannot answer for them; ``atlas survey --list`` prints each as a ``--stack``.

Read as every file a user names is (bounded), validated against the schema, then held to itself: every release of
``stack`` satisfies every line of ``requires`` that holds on this platform, a release the lines do not pin says
the day it was resolved as of, and no two stacks share an id. A file that breaks any of these is a ``UserError``
naming the file, the stack and the fix.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from harness.config.yaml_safety import load_yaml
from harness.core.errors import UserError
from harness.core.user_files import read_named
from harness.environments.stacks import Stack, marker_environment

SURVEY_FILE = "survey.yaml"
#: The largest survey file read.
MAX_SURVEY_BYTES = 4 * 2**20
_FIX = "see the survey file's own header for its fields (harness/analysis/atlas/survey.yaml)"


@dataclass(frozen=True)
class Provenance:
    """Where a stack came from: the repository, the tag or issue (and the tag's commit), the file, the day."""

    repository: str
    ref: str
    file: str
    date: str
    commit: str | None = None
    url: str | None = None

    def text(self) -> str:
        commit = f" ({self.commit[:12]})" if self.commit else ""
        return f"{self.repository} {self.ref}{commit}, {self.file}, {self.date}"


@dataclass(frozen=True)
class SurveyStack:
    id: str
    kind: str
    title: str
    source: Provenance
    #: The requirement lines of the packages that decide documented failures, as the source writes them.
    requires: tuple[str, ...]
    stack: Stack
    #: The day the lines were resolved as of, where they do not pin every release of ``stack``.
    resolved_as_of: str | None = None
    note: str = ""

    def text(self) -> str:
        """The stack as ``--stack`` takes it."""
        return self.stack.text()

    @property
    def date(self) -> str:
        """The day the environment's other packages are resolved as of: the stack's own."""
        return self.resolved_as_of or self.source.date


def default_survey_path() -> Path:
    return Path(str(resources.files("harness.analysis.atlas").joinpath(SURVEY_FILE)))


def _schema() -> dict[str, Any]:
    text = resources.files("harness.analysis.atlas").joinpath("survey.schema.json").read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


def _field(parts: Sequence[object]) -> str:
    return ".".join(str(p) for p in parts) or "(top level)"


def _pinned(requirement: Requirement) -> bool:
    specs = list(requirement.specifier)
    return len(specs) == 1 and specs[0].operator in ("==", "===") and not specs[0].version.endswith(".*")


def _check_stack(path: Path, index: int, raw: Mapping[str, Any]) -> SurveyStack:
    where = f"stacks[{index}] ({raw['id']})"
    versions = {str(canonicalize_name(k)): str(v) for k, v in raw["stack"].items()}
    environment = marker_environment()
    pinned: set[str] = set()
    for number, line in enumerate(raw["requires"]):
        field = f"{where}.requires[{number}]"
        try:
            requirement = Requirement(line)
        except InvalidRequirement as exc:
            raise UserError(path, field, f"{line!r} is not a requirement ({exc})", "write it as pip reads it") from None
        if requirement.marker is not None and not requirement.marker.evaluate(environment):
            raise UserError(
                path, field, f"{line!r} does not hold on this platform", "leave out lines for other platforms"
            )
        name = canonicalize_name(requirement.name)
        version = versions.get(name)
        if version is None:
            raise UserError(path, field, f"requires {name}, which the stack does not name", f"add {name} to stack")
        if not SpecifierSet(str(requirement.specifier), prereleases=True).contains(Version(version)):
            raise UserError(
                path, field, f"stack's {name} {version} does not satisfy {line!r}", "resolve the lines again"
            )
        if _pinned(requirement):
            pinned.add(name)
    unpinned = sorted(set(versions) - pinned)
    if unpinned and not raw.get("resolved_as_of"):
        raise UserError(
            path,
            f"{where}.resolved_as_of",
            f"is missing: {', '.join(unpinned)} are not pinned by requires",
            "say the day they were resolved as of (ft-regress atlas check --requirements FILE --as-of DAY)",
        )
    source = raw["source"]
    return SurveyStack(
        id=raw["id"],
        kind=raw["kind"],
        title=raw["title"],
        source=Provenance(
            repository=source["repository"],
            ref=source["ref"],
            file=source["file"],
            date=source["date"],
            commit=source.get("commit"),
            url=source.get("url"),
        ),
        requires=tuple(raw["requires"]),
        stack=Stack(source=f"{path} {raw['id']}", versions=versions),
        resolved_as_of=raw.get("resolved_as_of"),
        note=raw.get("note", ""),
    )


def load_survey(path: Path | None = None) -> list[SurveyStack]:
    """The surveyed stacks of ``path`` (the built-in survey where None), in the file's order, validated."""
    path = Path(path) if path is not None else default_survey_path()
    data = load_yaml(path, read_named(path, "--survey", "pass a survey file", limit=MAX_SURVEY_BYTES, what="a survey"))
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(_schema()).iter_errors(data))
    if error is not None:
        raise UserError(path, _field(list(error.absolute_path)), error.message, _FIX)
    stacks = [_check_stack(path, i, raw) for i, raw in enumerate(data["stacks"])]
    seen: set[str] = set()
    for i, stack in enumerate(stacks):
        if stack.id in seen:
            raise UserError(path, f"stacks[{i}].id", f"{stack.id!r} is the id of an earlier stack", "give it its own")
        seen.add(stack.id)
    return stacks


def _torch(stack: SurveyStack) -> Version:
    text = stack.stack.versions.get("torch")
    return Version(Version(text).public) if text else Version("0")


def in_survey_order(stacks: Sequence[SurveyStack]) -> list[SurveyStack]:
    """The stacks by torch release, then day: the order the survey proves them in, and slices them by, so that a
    slice needs few torch builds."""
    return sorted(stacks, key=lambda s: (_torch(s), s.date, s.id))


def slice_of(stacks: Sequence[SurveyStack], index: int, count: int) -> list[SurveyStack]:
    """The ``index``-th (from 1) of ``count`` stretches of ``stacks`` in survey order, as even as can be."""
    ordered = in_survey_order(stacks)
    size = len(ordered)
    return ordered[(index - 1) * size // count : index * size // count]
