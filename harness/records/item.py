"""The record a run writes per item (cell x repro x mode), typed: ``ItemRecord``.

A record is built once (``harness/pipeline/item_records.py``), validated whenever it is read back
(``parse_record``: a line that is not a record of a known schema, an outcome that does not exist,
a field of the wrong type is refused, naming the field), and never edited in place: a rerun or an
annotation makes a new record (``evolve``). On disk it is one JSON object per line of
``results.jsonl`` with the fields below; the measured figures are top-level fields named by each
measure's declaration (``repros/runtime/measures``: ``peak_mem_bytes``, ``step_time_s``...), held
here as ``figures`` by measure, so a new measure needs no field here and every display reads it
through its declaration. A field a newer harness added is kept as it is (a merge does not lose it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_serializer, model_validator
from pydantic_core.core_schema import SerializerFunctionWrapHandler

from harness.core.json import JsonValue
from repros.runtime.measures import Measure, Quantity, Reduction, measures
from repros.runtime.outcomes import UNOBSERVED, Outcome

#: The record layout this harness writes; a record of another version is refused, not guessed at.
SCHEMA_VERSION = 1
#: ``workaround``'s values: the fixed trainer ran, or the repro's own workaround did.
FIXED_TRAINER = "fixed trainer"
OWN_WORKAROUND = "own"
KNOWN_SCHEMA_VERSIONS = (1,)
#: The fields without which a line is not a record at all.
IDENTITY_FIELDS = ("schema_version", "cell", "repro", "mode", "outcome")
#: The longest error message a record keeps in the results file; the full text stays in the
#: rank's own record and log, and ``error.full_message_chars`` says how long it was.
MAX_MESSAGE_CHARS = 2000
#: The longest traceback a record keeps: its end (the raising frames and the exception), where
#: the cause of a failure nobody has named yet is read.
MAX_TRACEBACK_CHARS = 6000


@dataclass(frozen=True)
class ItemId:
    cell: str
    repro: str
    mode: str

    def label(self) -> str:
        return f"{self.cell}/{self.repro}/{self.mode}"


class Frozen(BaseModel):
    """A part of a record: typed, immutable, exactly its fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class StepTime(Frozen):
    """A figure per step, over the steps after warm-up."""

    median: float
    min: float
    max: float
    iqr: float
    n: int


class ErrorSummary(Frozen):
    type: str
    #: The first line of the message, at most ``MAX_MESSAGE_CHARS`` characters.
    message: str
    rank: int | None
    full_message_chars: int | None = None
    #: The failing rank's traceback (its last ``MAX_TRACEBACK_CHARS`` characters).
    traceback: str | None = None


class RankSummary(Frozen):
    rank: int
    status: str | None
    phase: str | None = None
    exitcode: int | None = None
    error_type: str | None = None
    log_tail: str = ""
    #: The rank its code was told it is, where that is not the rank it was launched as.
    ran_as_rank: int | None = None


class EnvSummary(Frozen):
    key: str
    path: str | None
    python: str
    reused: bool
    build_s: float
    #: The environment provider that made it ready (``uv``, ``passthrough``...).
    provider: str = "uv"
    #: Records of earlier versions said whether the interpreter was the caller's own.
    passthrough: bool = False
    extensions_dir: str = ""


class AppliedGuard(Frozen):
    """One of the fixed trainer's workarounds, as applied to an item."""

    id: str
    reason: str = ""


class Attempt(Frozen):
    """An earlier attempt of an item run again (``--reruns``)."""

    outcome: Outcome
    signature: str | None = None
    error_type: str | None = None
    message: str = ""
    wall_s: float | None = None
    item_dir: str | None = None
    #: crosscheck: the largest share of its tolerance any quantity took (how close the attempt came to diverging).
    closest_ratio: float | str | None = None


class Figure(Frozen):
    """One measured figure of an item, merged over its ranks by its measure's reduction."""

    #: The headline number: bytes for memory, the median seconds per step for time.
    value: float | None
    #: How it was taken (``cpu_peak_rss``, ``cuda_max_allocated``...), where the measure says.
    kind: str | None = None
    #: Each rank's figure (a figure per rank).
    per_rank: dict[str, int] = Field(default_factory=dict)
    #: The summary over the steps after warm-up (a figure per step).
    steps: StepTime | None = None


class Divergence(Frozen):
    """Where a crosscheck strategy first trained otherwise than one process: the step (None: before any),
    the quantity (``loss``, ``optimizer_steps``, ``grad_norm``, ``gradient``, ``weight``, ``saved_adapter``,
    ``reloaded_outputs``, ``merged_outputs``; ``error`` where it raised), the tensor where it is one, the
    strategy's and the reference's values, their relative difference and the tolerance it exceeded."""

    step: int | None = None
    quantity: str
    tensor: str | None = None
    value: float | str | None = None
    reference: float | str | None = None
    rel_diff: float | str | None = None
    tolerance: float | str | None = None


def _figure_fields(measure: Measure) -> tuple[str, ...]:
    fields = [measure.field]
    if measure.kind_field:
        fields.append(measure.kind_field)
    if measure.reduction is Reduction.MAX_OVER_RANKS:
        fields.append(f"{measure.field}_per_rank")
    return tuple(fields)


def _figure_from_fields(measure: Measure, data: Mapping[str, object]) -> Figure:
    raw = data.get(measure.field)
    kind = data.get(measure.kind_field) if measure.kind_field else None
    if measure.reduction is Reduction.MAX_OVER_RANKS:
        per_rank = data.get(f"{measure.field}_per_rank") or {}
        return Figure.model_validate({"value": raw, "kind": kind, "per_rank": per_rank})
    steps = StepTime.model_validate(raw) if raw is not None else None
    return Figure(value=steps.median if steps else None, kind=kind, steps=steps)


def _figure_to_fields(measure: Measure, figure: Figure | None) -> dict[str, JsonValue]:
    fields: dict[str, JsonValue] = {}
    if measure.reduction is Reduction.MAX_OVER_RANKS:
        value = figure.value if figure else None
        fields[measure.field] = int(value) if value is not None else None
        fields[f"{measure.field}_per_rank"] = dict(figure.per_rank) if figure else {}
    else:
        fields[measure.field] = figure.steps.model_dump() if figure and figure.steps else None
    if measure.kind_field:
        fields[measure.kind_field] = figure.kind if figure else None
    return fields


class ItemRecord(BaseModel):
    """One item's observation. Fields without a default are in every record; the rest where the
    item ran (launch, ranks), or where a command adds them (grid, costs, bisect, reruns)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    schema_version: Literal[1]
    run_id: str
    cell: str
    repro: str
    mode: str
    outcome: Outcome
    signature: str | None
    expected: Outcome | None
    expected_when: dict[str, str] | None = None
    expected_established_by: str | None = None
    expected_device: str | None = None
    matched: bool
    #: Explored (``run --explore``, or a repro with no expectation for the mode): the observation
    #: is a finding, reported per cell, never a missed expectation (unless nothing was observed).
    explored: bool = False
    #: In fixed mode, what ran: ``fixed trainer`` (the harness's guards over the documented scenario) or
    #: ``own`` (the repro's own workaround: a script repro's ``fixed`` command, which measures no steps
    #: and applies no guard). None in other modes, and in records written before it was kept.
    workaround: str | None = None
    #: The matrix cell a pinned or bisected cell was derived from (``--pin``, ``bisect``).
    cell_origin: str | None = None
    #: The tracked packages' versions (and Python's) as rank 0 imported them.
    versions: dict[str, str | None]
    #: The cell's listing of the same, where it differs from what the ranks imported.
    versions_listed: dict[str, str | None] | None = None
    #: The world the ranks ran in, as they saw it (the launch's, unless a repro's own settings told
    #: them another: then ``world_size_launched`` is the launch's, and a reason says so).
    world_size: int
    world_size_launched: int | None = None
    device: str | None
    device_name: str | None = None
    cuda_version: str | None = None
    nccl_version: str | None = None
    backend: str | None = None
    #: The measured figures, by measure name (on disk: each measure's own top-level fields).
    figures: dict[str, Figure] = Field(default_factory=dict)
    #: The test model's size the item ran at (``tiny`` or ``small``).
    model: str = "tiny"
    #: The test model's family the item ran (``repros/runtime/families.py``).
    family: str = "qwen2"
    #: The matrix cell a family variant (``<cell>@<family>``, ``--family``) was made from.
    family_of: str | None = None
    #: ``costs``: the workaround variant this item ran (its record's ``mode`` is the same name).
    variant: str | None = None
    #: ``grid``: the combination this item ran, axis -> value.
    scenario: dict[str, str] | None = None
    #: ``crosscheck`` for a crosscheck item (cell x strategy; its ``repro`` is ``crosscheck``, its ``mode`` the
    #: strategy's name); None for a repro's item.
    kind: str | None = None
    #: ``crosscheck``: the strategy's stable name, and its parts (``engine``, ``stage``, ``precision``,
    #: ``checkpointing``, ``accumulation``, ``adapter``, ``optimizer``).
    strategy: str | None = None
    strategy_parts: dict[str, JsonValue] | None = None
    #: ``crosscheck``: where the strategy first trained otherwise than the reference (None: it agreed).
    divergence: Divergence | None = None
    #: ``crosscheck``: the comparison as the ranks made it: the reference it was held to, the tolerance, both
    #: trajectories (loss, gradient norm, optimizer steps), the closest call, the seed and steps.
    crosscheck: dict[str, JsonValue] | None = None
    wall_s: float
    #: The CPU seconds its ranks used, all together (what the item's work took of the machine).
    cpu_s: float | None = None
    #: Seconds from the launch to the first training step of the slowest rank (where every rank trained).
    to_training_s: float | None = None
    #: Seconds from the first step to the last (every rank's), where every rank trained: the item's
    #: wall less this is what the harness and the libraries cost around the training.
    training_s: float | None = None
    #: The cluster node that ran the item (``--executor ray|slurm``); None: the orchestrator's machine.
    node: str | None = None
    #: ``--reruns``: the earlier attempts of this item, and whether a rerun matched the
    #: expectation the first attempt contradicted.
    attempts: list[Attempt] = Field(default_factory=list)
    flaky: bool = False
    #: ``--repeat N``: how many attempts the item had (then ``attempts`` holds every one, the last
    #: included), and how many ended with each outcome (the flake rate).
    repeat: int | None = None
    outcome_counts: dict[str, int] | None = None
    error: ErrorSummary | None
    reasons: list[str]
    guards: list[AppliedGuard]
    losses: list[float | str | None] | None = None
    ranks: list[RankSummary] = Field(default_factory=list)
    launcher_tail: str = ""
    leftovers_killed: list[int] = Field(default_factory=list)
    stale_build_locks_removed: list[str] = Field(default_factory=list)
    shm_segments_removed: list[str] = Field(default_factory=list)
    env: EnvSummary | None
    repro_cmd: str
    launch_cmd: list[str] = Field(default_factory=list)
    launcher: str | None = None
    launcher_fallback: str | None = None
    gpus_leased: list[str] = Field(default_factory=list)
    #: Why the cell's environment was rebuilt before this item (it was found damaged), if it was.
    environment_repaired: str | None = None
    item_dir: str | None = None
    started_at: str
    finished_at: str
    # bisect
    bisect_point: str | None = None
    bisect_step_s: float | None = None
    same_as_earlier: bool = False

    @field_validator("guards", mode="before")
    @classmethod
    def _guard_names(cls, value: JsonValue) -> JsonValue:
        """Records of older runs name a guard by its id alone."""
        if isinstance(value, list):
            return [{"id": g} if isinstance(g, str) else g for g in value]
        return value

    @field_validator("outcome_counts")
    @classmethod
    def _counted_outcomes(cls, value: dict[str, int] | None) -> dict[str, int] | None:
        """Each count is of an outcome that exists (a count of anything else is not one of the run's)."""
        unknown = [k for k in value or {} if k not in Outcome.__members__]
        if unknown:
            raise ValueError(f"counts {unknown[0]!r}, which is not an outcome (one of {', '.join(Outcome)})")
        return value

    @model_validator(mode="before")
    @classmethod
    def _gather_figures(cls, data: object) -> object:
        """On disk each measure has top-level fields: gather them into ``figures``."""
        if not isinstance(data, Mapping) or "figures" in data:
            return data
        rest: dict[str, object] = dict(data)
        figures: dict[str, Figure] = {}
        for measure in measures():
            names = _figure_fields(measure)
            if any(name in rest for name in names):
                figures[measure.name] = _figure_from_fields(measure, rest)
            for name in names:
                rest.pop(name, None)
        rest["figures"] = figures
        return rest

    @model_serializer(mode="wrap")
    def _spread_figures(self, handler: SerializerFunctionWrapHandler) -> dict[str, JsonValue]:
        data: dict[str, JsonValue] = handler(self)
        data.pop("figures", None)
        if "figures" in self.model_fields_set:
            for measure in measures():
                data.update(_figure_to_fields(measure, self.figures.get(measure.name)))
        return data

    def __contains__(self, item: object) -> bool:
        """``"field" in record`` would compare with pydantic's (name, value) pairs and say False:
        refuse it, so no check passes without checking anything."""
        raise TypeError(f"{type(self).__name__} has attributes, not keys: read the field, or use as_json()")

    # -- reading ---------------------------------------------------------------------
    @property
    def id(self) -> ItemId:
        return ItemId(self.cell, self.repro, self.mode)

    @property
    def key(self) -> tuple[str, str, str]:
        """An item's identity in a run: (cell, repro, mode)."""
        return self.cell, self.repro, self.mode

    def figure(self, name: str) -> Figure | None:
        """The measured figure of the measure ``name``, where one was measured."""
        found = self.figures.get(name)
        return found if found is not None and found.value is not None else None

    @property
    def is_finding(self) -> bool:
        """An explored item that observed something: what it found is the result, matched or not."""
        return self.explored and self.outcome not in UNOBSERVED

    @property
    def counts_against(self) -> bool:
        """Whether the record makes a run fail (exit 1, a JUnit failure, a failed pytest item): it
        did not match its expectation and is not an explored item's finding."""
        return not self.matched and not self.is_finding

    def versions_differing(self) -> list[str]:
        """``package listed L, imported I`` for each tracked package the ranks imported at another
        version than the cell's listing says (empty where they agree)."""
        listed = self.versions_listed or {}
        return [
            f"{k} listed {listed.get(k) or 'absent'}, imported {v or 'none'}"
            for k, v in self.versions.items()
            if k in listed and listed.get(k) != v
        ]

    @property
    def guard_ids(self) -> tuple[str, ...]:
        return tuple(g.id for g in self.guards)

    # -- writing -----------------------------------------------------------------------
    def as_json(self) -> dict[str, JsonValue]:
        """The record as it is written: the fields it was built with, figures spread out."""
        return self.model_dump(mode="json", exclude_unset=True)

    def evolve(self, **changes: object) -> Self:
        """A new record: this one with ``changes``, validated like any record."""
        return type(self).model_validate({**self.as_json(), **_plain(changes)})


def _plain(changes: Mapping[str, object]) -> dict[str, object]:
    return {
        k: v.model_dump(mode="json", exclude_unset=True) if isinstance(v, BaseModel) else v for k, v in changes.items()
    }


class RecordError(ValueError):
    """A line that is not a record this harness can read."""


def parse_record(value: object) -> ItemRecord:
    """``value`` (one decoded JSON line) as a record, or ``RecordError`` saying why not."""
    if not isinstance(value, dict):
        raise RecordError(f"is a JSON {type(value).__name__}, not a record object")
    missing = [f for f in IDENTITY_FIELDS if f not in value]
    if missing:
        raise RecordError(f"has no {', '.join(missing)}")
    version = value["schema_version"]
    if version not in KNOWN_SCHEMA_VERSIONS:
        raise RecordError(
            f"has schema_version {version!r}; this harness reads {', '.join(map(str, KNOWN_SCHEMA_VERSIONS))} "
            "(written by another version of ft-regress)"
        )
    try:
        return ItemRecord.model_validate(value)
    except ValidationError as exc:
        raise RecordError(validation_problem(exc)) from None


def validation_problem(exc: ValidationError) -> str:
    """The first problem pydantic found, as one line naming the field."""
    first = exc.errors()[0]
    # A key of a user's record may hold anything, a line break included: such a part is quoted.
    where = ".".join(_field_part(part) for part in first["loc"]) or "(the record)"
    value = first.get("input")
    shown = repr(value) if not isinstance(value, dict | list) else type(value).__name__
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    message = " ".join(str(first["msg"]).split())
    return f"field {where}: {message} (got {shown[:80]}){more}"


def _field_part(part: object) -> str:
    text = str(part)
    return text if isinstance(part, int) or text.isidentifier() else repr(text)


def error_summary(error_type: str, message: str, rank: int | None, traceback: str | None = None) -> ErrorSummary:
    """The first non-blank line of ``message``, capped; the full length recorded where it was cut;
    and the end of the rank's traceback where there is one."""
    first = next((ln for ln in message.splitlines() if ln.strip()), "")
    more: dict[str, JsonValue] = {}
    if len(first) > MAX_MESSAGE_CHARS:
        more["full_message_chars"] = len(message)
    if traceback:
        more["traceback"] = traceback[-MAX_TRACEBACK_CHARS:]
    return ErrorSummary(type=error_type, message=first[:MAX_MESSAGE_CHARS], rank=rank, **more)


def counts_text(counts: Mapping[str, int]) -> str:
    """``47 PASS, 3 FAIL``: how many attempts ended with each outcome, most common first."""
    return ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def headline(record: ItemRecord, quantity: Quantity) -> tuple[Measure, Figure] | None:
    """The figure a display shows first for ``quantity``: the measured one whose measure ranks
    first (the training's peak before the process's; CPU time per step before wall)."""
    ranked = sorted(
        (m for m in measures() if m.quantity is quantity and m.headline is not None), key=lambda m: m.headline or 0
    )
    for measure in ranked:
        figure = record.figure(measure.name)
        if figure is not None:
            return measure, figure
    return None


def labels(records: Sequence[ItemRecord]) -> list[str]:
    return [r.id.label() for r in records]
