"""Crosscheck records where the harness looks: the findings a run prints, watch's verdicts, the atlas's
evidence, check's last line, and the commands that rerun or bisect one item."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from harness.analysis.atlas.evidence import Sources, _read_run, crosscheck_claims
from harness.config.repros import discover
from harness.planning.commands import crosscheck_command
from harness.planning.crosscheck import planned
from harness.planning.run_options import CacheChoice, StackChoice
from harness.records.changes import FIXED_UPSTREAM, REGRESSED
from harness.records.run_meta import RunMeta
from harness.reports.check_summary import conclusion
from harness.reports.crosscheck_table import findings, print_crosscheck
from harness.workflows.watch.verdicts import verdict_of
from repros.trainer.crosscheck.strategy import parse
from tests.crosscheck.test_strategies import load_shipped_matrix
from tests.support.report_fixture import _record, typed, write_run

DIVERGENCE = {
    "step": 1,
    "quantity": "weight",
    "tensor": "m.q_proj.lora_B.default.weight",
    "value": 0.48,
    "reference": 0.47,
    "rel_diff": 0.0072,
    "tolerance": 0.0065,
}


def crosscheck_record(cell: str, strategy: str, outcome: str, **fields: Any) -> dict[str, Any]:
    parts = parse(strategy).parts()
    expected = fields.pop("expected", outcome)
    return _record(
        cell,
        "crosscheck",
        strategy,
        outcome,
        kind="crosscheck",
        strategy=strategy,
        strategy_parts=parts,
        expected=expected,
        matched=fields.pop("matched", outcome == expected),
        divergence=DIVERGENCE if outcome == "DIVERGES" else None,
        crosscheck={"closest_ratio": 0.03 if outcome == "AGREES" else 1.1, "compared": 294},
        repro_cmd=f"ft-regress crosscheck --cells {cell} --strategies {strategy}",
        **fields,
    )


def test_a_divergence_nobody_documented_is_a_finding_shown_by_its_smallest_strategy() -> None:
    records = typed(
        [
            crosscheck_record("current", "fsdp2-bf16-ckpt-nr-dora", "DIVERGES", expected="AGREES"),
            crosscheck_record("current", "fsdp2-bf16", "DIVERGES", expected="AGREES"),
            crosscheck_record("current", "zero2-fp32-adamw8bit", "DIVERGES", signature="F36.state-precision-by-shard"),
            crosscheck_record("current", "ddp-fp32", "AGREES"),
        ]
    )
    found = findings(records)
    assert [(f["cell"], f["strategy"], f["quantity"], f["step"]) for f in found] == [
        ("current", "fsdp2-bf16", "weight", 1)
    ]
    assert found[0]["repro_cmd"] == "ft-regress crosscheck --cells current --strategies fsdp2-bf16"
    console = Console(record=True, width=200)
    print_crosscheck(console, records)
    said = console.export_text()
    assert (
        "✗ finding in current: fsdp2-bf16 trains unlike one process: weight of m.q_proj.lora_B.default.weight at step 1"
        in said
    )
    assert "rerun: ft-regress crosscheck --cells current --strategies fsdp2-bf16" in said
    assert "F36.state-precision-by-shard" in said and "1 agree, 3 diverge (1 as a documented failure expects)" in said


def test_watch_calls_a_strategy_that_stopped_agreeing_a_regression_and_the_reverse_fixed_upstream() -> None:
    agrees, diverges = typed(
        [crosscheck_record("current", "zero2-bf16", "AGREES"), crosscheck_record("current", "zero2-bf16", "DIVERGES")]
    )
    assert verdict_of(agrees, diverges)[0] == REGRESSED
    assert verdict_of(diverges, agrees)[0] == FIXED_UPSTREAM


def test_the_atlas_reads_a_crosscheck_record_as_evidence_of_the_failure_that_makes_its_strategy_diverge(
    tmp_path: Path,
) -> None:
    raw = [
        crosscheck_record("current", "zero2-fp32-adamw8bit", "DIVERGES", signature="F36.state-precision-by-shard"),
        crosscheck_record("ds-0.19.2", "zero3-fp32-adamw8bit", "AGREES"),
        crosscheck_record("current", "fsdp2-bf16", "DIVERGES", expected="AGREES"),
        crosscheck_record("current", "ddp-fp32", "AGREES"),
    ]
    run = write_run(tmp_path / "run", "run-x", "2026-11-29T00:00:00+00:00", raw)
    discovery = discover()
    meta = RunMeta.model_validate_json((run / "run.json").read_text())
    typed_records = typed(raw)
    claims = [crosscheck_claims(r, meta, discovery, run) for r in typed_records]
    assert [(f, c.outcome) for f, c in claims[0]] == [("F36", "REPRODUCED")]
    assert [(f, c.outcome) for f, c in claims[1]] == [("F36", "NOT_REPRODUCED")]
    assert claims[2] == [] and claims[3] == []
    assert claims[0][0][1].when["bitsandbytes"] == "==0.50.2" and claims[0][0][1].evidence[0].command.startswith(
        "ft-regress crosscheck"
    )
    sources = Sources()
    _read_run(run, discovery, sources)
    assert len(sources.claims["F36"]) == 2
    assert any("fsdp2-bf16 trains unlike one process, named by no documented failure" in n for n in sources.notes)


def test_checks_last_line_counts_the_strategies_that_train_otherwise() -> None:
    assert conclusion([], diverged=2).endswith(
        "2 training strategies train otherwise than one process (crosscheck, above)"
    )


def test_a_crosscheck_item_is_rerun_by_one_crosscheck_command_as_it_was_asked() -> None:
    matrix = load_shipped_matrix()
    items, _ = planned([matrix.cells["current"]], [parse("zero3-bf16-ckpt-nr")], {"seed": 2, "steps": 6, "break": None})
    command = crosscheck_command(matrix.path, items[0], StackChoice(), CacheChoice())
    assert command.split()[command.split().index("crosscheck") :] == [
        "crosscheck",
        "--matrix",
        str(matrix.path),
        "--cells",
        "current",
        "--strategies",
        "zero3-bf16-ckpt-nr",
        "--steps",
        "6",
        "--seed",
        "2",
    ]
