"""A rank's record is declared once (``repros/runtime/record.py``): what ``rank_main`` writes is what
the orchestrator reads back, field by field, validated; a field nobody declared cannot be written."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from harness.records.rank import RankRecord, parse_rank_record, read_rank_record
from repros.runtime import record as written
from repros.runtime.record import ImportedPackage, Measured, RanAs, RankError, rank_record_path, write_rank_record
from tests.support.paths import REPO_ROOT

EVERY_FIELD = written.RankRecord(
    rank=1,
    local_rank=1,
    world_size=2,
    pid=4242,
    mode="bug",
    status=written.ERROR,
    phase="run",
    started_at="2026-11-20T10:00:00.000+00:00",
    finished_at="2026-11-20T10:00:09.000+00:00",
    versions={"torch": "2.13.0", "peft": None},
    versions_imported={"torch": ImportedPackage(version="2.13.0", path="/env/torch", imported=True)},
    python_version="3.11.7",
    training_began_at=1.5,
    training_ended_at=7.25,
    master_addr="127.0.0.1",
    master_port="29500",
    device="cpu",
    backend="gloo",
    device_name=None,
    cuda_version=None,
    nccl_version=None,
    model="tiny",
    family="phi3",
    unavailable_reason=None,
    error=RankError(
        type="ValueError",
        message="boom",
        traceback="Traceback...",
        signature_verdicts={"F1.x": False},
        stack_failure=None,
    ),
    measures={"step_time": Measured(kind="wall", per_step=[0.1, 0.2]), "peak_mem": Measured(kind="rss", value=9.0)},
    warmup_steps=1,
    wall_s=9.5,
    facts={"train": {"losses": [2.0, 1.0]}, "scenario_facts": {"engine": "deepspeed"}},
    ran_as=RanAs(rank=1, local_rank=1, world_size=2, source="process group"),
)


def test_what_a_rank_writes_is_read_back_whole(tmp_path: Path) -> None:
    write_rank_record(tmp_path, 1, EVERY_FIELD)
    read = read_rank_record(rank_record_path(tmp_path, 1))
    assert isinstance(read, RankRecord)
    for declared in dataclasses.fields(written.RankRecord):
        assert getattr(read, declared.name) == getattr(EVERY_FIELD, declared.name), declared.name
    # The model's family (written before, never declared, so never read) is read like any field.
    assert read.family == "phi3"
    assert read.train is not None and read.train.losses == [2.0, 1.0]


def test_the_orchestrator_declares_no_field_of_its_own() -> None:
    assert [f.name for f in dataclasses.fields(RankRecord)] == [f.name for f in dataclasses.fields(written.RankRecord)]
    tree = ast.parse((REPO_ROOT / "harness" / "records" / "rank.py").read_text())
    (read,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "RankRecord"]
    assert not [node for node in read.body if isinstance(node, ast.AnnAssign)]


def test_a_field_nobody_declared_cannot_be_written() -> None:
    with pytest.raises(TypeError):
        EVERY_FIELD.evolve(famly="llama")
    with pytest.raises((AttributeError, TypeError)):
        setattr(EVERY_FIELD, "phase", "setup")  # noqa: B010 - what a misspelt assignment does


def test_a_field_of_the_wrong_type_refuses_the_record(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="rank"):
        parse_rank_record({"rank": "zero", "status": "ok"})
    rank_record_path(tmp_path, 0).write_text(json.dumps({"rank": 0, "status": "ok", "measures": {"x": {"value": []}}}))
    assert read_rank_record(rank_record_path(tmp_path, 0)) is None
