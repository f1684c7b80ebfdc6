"""``changes.json``: what ``watch`` found changed since the previous night, one entry per item.

Each entry names the item (``cell``, ``repro``, ``mode``), its outcome the night before and tonight
(``before``, ``after``), every package whose resolved version moved between the two nights
(``moved``: package -> [previous, current]), the ``verdict`` and the ``culprit`` (the last release
with the old outcome and the first with the new one, or null where none was named), with the
``reason`` in words and what decided it (``evidence``: the reruns' outcomes, the bisect's directory
and final line). The file is written whole (a temporary file renamed over it) and read back
validated: a damaged file is named, never half-trusted.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from harness.core.user_files import read_named_text
from repros.runtime.outcomes import Outcome

CHANGES_FILE = "changes.json"
CHANGES_MARKDOWN = "changes.md"

#: A documented failure stopped reproducing (bug mode: REPRODUCED -> NOT_REPRODUCED).
FIXED_UPSTREAM = "fixed-upstream"
#: Something that passed now fails, or a known failure now fails differently.
REGRESSED = "regressed"
#: Any other change of outcome (the fixed trainer passes again, an item could not run).
CHANGED = "changed"
#: The change did not hold when the item ran again.
FLAKY = "flaky"
VERDICTS = (REGRESSED, FIXED_UPSTREAM, CHANGED, FLAKY)
Verdict = Literal["regressed", "fixed-upstream", "changed", "flaky"]


class Culprit(BaseModel):
    model_config = ConfigDict(frozen=True)

    package: str
    #: The last release with the old outcome, and the first with the new one.
    last: str
    first: str


class Change(BaseModel):
    """One item whose outcome changed between two nights, and what watch made of it."""

    model_config = ConfigDict(frozen=True, extra="allow")

    cell: str
    repro: str
    mode: str
    #: Outcomes of the vocabulary: one that does not exist is refused when the file is read.
    before: Outcome
    after: Outcome
    moved: dict[str, tuple[str | None, str | None]] = Field(default_factory=dict)
    verdict: Verdict
    culprit: Culprit | None = None
    #: Why the verdict, in words: what ran again, what a bisect found or could not decide.
    reason: str = ""
    before_signature: str | None = None
    after_signature: str | None = None
    #: The previous night's cell, where it had another name (a ``--pin`` cell against its matrix cell).
    previous_cell: str | None = None
    #: What decided it: reruns' outcome counts, a bisect's directory, final line and range left.
    evidence: dict[str, JsonValue] = Field(default_factory=dict)
    #: For ``fixed-upstream``: the command that records the new observation as the expectation.
    update_command: str | None = None

    @property
    def item(self) -> str:
        return f"{self.cell}/{self.repro}/{self.mode}"


class ChangesFileError(Exception):
    """``changes.json`` exists but is not a list of changes (``message`` says where)."""


def write_changes(run_dir: Path, changes: Sequence[Change]) -> Path:
    path = run_dir / CHANGES_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps([c.model_dump(mode="json") for c in changes], indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


#: The largest ``changes.json`` read.
MAX_CHANGES_BYTES = 64 * 2**20


def read_changes(run_dir: Path) -> list[Change] | None:
    """The changes a watch run found (None: not a watch run, or it found none yet)."""
    path = run_dir / CHANGES_FILE
    if not path.exists():
        return None
    text = read_named_text(path, "", "pass a watch night's directory", limit=MAX_CHANGES_BYTES, what="a watch night")
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ChangesFileError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(raw, list):
        raise ChangesFileError(f"{path}: a list of changes expected, found {type(raw).__name__}")
    changes = []
    for i, entry in enumerate(raw):
        try:
            changes.append(Change.model_validate(entry))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ChangesFileError(f"{path}: entry {i} ({where}): {first['msg']}") from None
    return changes
