"""A repro's facts are its own: whatever names and values a repro records under ``ctx.facts``, none
overwrites a field of the rank's or the item's record, none decides an outcome (the ranks' status
and error do), the run finishes and ``--resume`` reads it back.

The names tried are every field of ``RankRecord`` and ``ItemRecord`` (and the measures' on-disk
fields), the three the orchestrator reads by name (``train``, ``guards``, ``scenario_facts``) and
any other text; the values are any JSON."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.config.repros import discover
from harness.environments import Environment
from harness.execution.classify import classify
from harness.execution.launchers.result import LaunchResult
from harness.pipeline.item_records import item_record
from harness.records.item import ItemId, ItemRecord
from harness.records.rank import RankRecord, parse_rank_record
from harness.records.run_dir import RunDir
from repros.runtime.measures import measures
from repros.runtime.outcomes import Outcome
from tests.support import throwaway_run

#: The names the orchestrator reads facts by.
READ_BY_NAME = ("train", "guards", "scenario_facts")
#: Every name a fact could collide with.
FIELD_NAMES = sorted(
    {
        *(f.name for f in dataclasses.fields(RankRecord)),
        *ItemRecord.model_fields,
        *(f for m in measures() for f in (m.field, m.kind_field, f"{m.field}_per_rank") if f),
        *READ_BY_NAME,
        "record_version",
        "facts",
    }
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
#: What a repro that meant harm (or got it wrong) would record: its own idea of the record's fields.
FORGED: dict[str, Any] = {
    "status": "ok",
    "error": None,
    "outcome": "PASS",
    "matched": True,
    "expected": "NOT_A_REAL_OUTCOME",
    "schema_version": 99,
    "rank": "zero",
    "cell": "elsewhere",
    "repro": "F9",
    "mode": "fixed",
    "run_id": {"not": "a string"},
    "wall_s": "slow",
    "guards": "not a list",
    "train": {"losses": [2.0, 1.0], "adapter_grad_norms": {"a": [1.0]}, "adapter_weight_delta": {"a": 1.0}},
}
fact_names = st.sampled_from(FIELD_NAMES) | st.text(min_size=1, max_size=12)
#: A repro may even replace ``ctx.facts`` with something that is not a mapping at all.
facts_dicts = st.dictionaries(fact_names, json_values, max_size=6) | st.just(FORGED) | json_values

SPEC = discover().repros["F1"].spec
ENV = Environment(
    key="k", python="python", python_version="3.11", packages={}, path=None, extensions_dir="", reused=True, build_s=0
)


def _as_read_back(record: dict[str, Any]) -> RankRecord:
    """What the orchestrator reads of a rank record written as ``rank_main`` writes it."""
    return parse_rank_record(json.loads(json.dumps({"record_version": 1, **record}, default=str)))


def _rank(rank: int, raised: bool, facts: Any) -> dict[str, Any]:
    own: dict[str, Any] = {"rank": rank, "phase": "run", "device": "cpu", "backend": "gloo", "facts": facts}
    if raised and rank == 0:
        return {**own, "status": "error", "error": {"type": "ValueError", "message": "the repro raised"}}
    return {**own, "status": "ok"}


def _launch(raised: bool, facts: Any) -> LaunchResult:
    records: dict[int, RankRecord | None] = {r: _as_read_back(_rank(r, raised, facts)) for r in (0, 1)}
    return LaunchResult(["x"], 1 if raised else 0, False, 1.0, 2, records, {0: 1 if raised else 0, 1: 0})


def _item(mode: str, raised: bool, facts: Any) -> ItemRecord:
    launch = _launch(raised, facts)
    return item_record(
        run_id="r",
        item=ItemId("c", "F1", mode),
        observation=classify(mode, SPEC, launch),
        expected=None,
        env=ENV,
        launch=launch,
        repro_cmd="cmd",
        item_dir=Path("/tmp/item"),
        started_at="a",
        finished_at="b",
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(facts=facts_dicts, mode=st.sampled_from(["bug", "fixed"]), raised=st.booleans())
def test_no_fact_overwrites_a_record_field_or_decides_an_outcome(facts: Any, mode: str, raised: bool) -> None:
    # The same ranks with no facts at all, and with only the training facts (which a fixed run is judged by).
    bare = _item(mode, raised, {})
    train = {"train": facts["train"]} if isinstance(facts, dict) and "train" in facts else {}
    trained_only = _item(mode, raised, train)
    seen = _item(mode, raised, facts)
    if raised or mode == "bug":
        # A rank that raised, or a bug-mode run: status and error alone decide the outcome.
        assert (
            seen.outcome
            == bare.outcome
            == ((Outcome.DIFFERENT_ERROR if mode == "bug" else Outcome.FAIL) if raised else Outcome.NOT_REPRODUCED)
        )
    else:
        assert seen.outcome == trained_only.outcome and seen.outcome in (Outcome.PASS, Outcome.FAIL)
    # Every field but the two a validated named fact fills is the record's own.
    mine = {k: v for k, v in seen.as_json().items() if k not in ("guards", "losses", "outcome", "reasons", "matched")}
    theirs = {k: v for k, v in bare.as_json().items() if k not in ("guards", "losses", "outcome", "reasons", "matched")}
    assert mine == theirs
    assert all(isinstance(g.id, str) for g in seen.guards)


#: Values of every JSON type, none of them what the record's own field of that name holds.
HOSTILE_VALUES: list[Any] = [{"nested": [1, "two", None]}, "text", 12345678901234567890, -1.5, None, [1, "x"], True]


def _fact_for(cell: str) -> Any:
    index = int(cell[1:])
    if index == len(FIELD_NAMES):
        return dict(FORGED)
    if index > len(FIELD_NAMES):
        return ["ctx.facts", "replaced", "by", "a", "list"]
    name = FIELD_NAMES[index]
    return {name: FORGED.get(name, HOSTILE_VALUES[index % len(HOSTILE_VALUES)])}


def test_a_run_whose_repros_record_facts_named_like_record_fields_finishes_and_resumes(tmp_path: Path) -> None:
    # One cell per field name, one whose facts forge a whole record and one whose facts are no
    # mapping at all; odd cells' rank 0 raises.
    cells = [f"f{i}" for i in range(len(FIELD_NAMES) + 2)]

    def ranks_for(cell: str, rank: int) -> dict[str, Any]:
        return _rank(rank, raised=int(cell[1:]) % 2 == 1, facts=_fact_for(cell))

    matrix = throwaway_run.write_matrix(tmp_path / "matrix.yaml", cells)
    out = tmp_path / "run"
    with throwaway_run.registered(ranks_for):
        assert throwaway_run.run(matrix, out, tmp_path / "cache") == 1  # no expectation covers them: not a match
        records = RunDir(out).records()
        assert sorted(r.cell for r in records) == sorted(cells)
        for record in records:
            raised = int(record.cell[1:]) % 2 == 1
            assert record.outcome == (Outcome.DIFFERENT_ERROR if raised else Outcome.NOT_REPRODUCED), record.cell
            assert (record.error is not None) == raised and record.run_id == records[0].run_id
            assert record.repro == "F1" and record.mode == "bug" and record.schema_version == 1
            assert record.guards == [] and record.world_size == 2
        assert RunDir(out).read_meta().finished_at is not None and (out / "index.html").is_file()
        # --resume reads every record back and has nothing left to run.
        assert throwaway_run.resume(out) == 1
        assert len(RunDir(out).records()) == len(cells)
        assert len(throwaway_run.ThrowawayLauncher.launched) == len(cells)
