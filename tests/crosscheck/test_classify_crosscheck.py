"""A crosscheck item's outcome from what its ranks recorded, and what it is expected to be."""

from __future__ import annotations

from typing import Any

from harness.config.expectations import crosscheck_expectation
from harness.execution.classify import DIVERGENCE_EXCEPTION, classify, naming_a_divergence
from harness.records.rank import RankRecord
from repros.catalog.f1_zero3_frozen_ckpt import SPEC as F1
from repros.runtime.outcomes import Outcome
from repros.runtime.spec import Expectation, ReproSpec, Signature
from tests.support.rank_records import error_record, failed_launch, rank_record

DIVERGENCE = {
    "step": 1,
    "quantity": "grad_norm",
    "tensor": None,
    "value": 0.25,
    "reference": 0.5,
    "rel_diff": 0.5,
    "tolerance": 3e-5,
}


def agreed(rank: int) -> RankRecord:
    return rank_record(rank, "ok", phase="run", facts={"crosscheck": {"closest_ratio": 0.03, "divergence": None}})


def diverged(rank: int, facts: dict[str, Any] | None = None) -> RankRecord:
    record = rank_record(
        rank,
        "error",
        phase="run",
        error={"type": DIVERGENCE_EXCEPTION, "message": "zero2-fp32 trains unlike one process: grad_norm at step 1"},
        facts={
            "crosscheck": {"divergence": DIVERGENCE},
            "scenario_facts": facts or {"engine": "deepspeed", "stage": 2},
        },
    )
    return record


def test_ranks_that_ended_with_no_difference_agree() -> None:
    launch = failed_launch({0: agreed(0), 1: agreed(1)})
    launch = type(launch)(**{**launch.__dict__, "returncode": 0})
    assert classify("crosscheck", None, launch, []).outcome == Outcome.AGREES


def test_a_difference_rank_0_found_diverges_with_where_it_was() -> None:
    observation = classify("crosscheck", None, failed_launch({0: diverged(0), 1: agreed(1)}), [])
    assert observation.outcome == Outcome.DIVERGES
    assert observation.divergence == DIVERGENCE
    assert observation.signature is None  # nobody documented it: a finding


def test_a_raised_error_diverges_named_by_the_documented_signature() -> None:
    text = (
        "torch.utils.checkpoint: Recomputed values for the following tensors have different metadata than during "
        "the forward pass.\ntensor at position 4:\nsaved metadata: {'shape': torch.Size([64]), "
        "'dtype': torch.bfloat16, 'device': device(type='cpu')}\nrecomputed metadata: {'shape': torch.Size([0]), "
        "'dtype': torch.bfloat16, 'device': device(type='cpu')}\n"
    )
    raised = error_record(0, "torch.utils.checkpoint.CheckpointError", text)
    observation = classify("crosscheck", None, failed_launch({0: raised, 1: rank_record(1, "running")}), [F1])
    assert observation.outcome == Outcome.DIVERGES
    assert observation.signature == "F1.recompute-shape-0"
    assert observation.divergence is not None and observation.divergence["quantity"] == "error"
    assert "CheckpointError" in str(observation.divergence["value"])


def test_the_stack_failing_or_a_strategy_the_cell_cannot_run_is_infra_never_a_divergence() -> None:
    stack = rank_record(
        0,
        "error",
        phase="run",
        error={
            "type": "ImportError",
            "message": "no deepspeed",
            "stack_failure": "deepspeed does not import in this cell",
        },
    )
    assert classify("crosscheck", None, failed_launch({0: stack, 1: agreed(1)}), []).outcome == Outcome.INFRA
    unavailable = rank_record(
        0, "unavailable", phase="run", unavailable_reason="FSDP1 of torch 2.0 cannot run on a CPU"
    )
    observation = classify("crosscheck", None, failed_launch({0: unavailable, 1: agreed(1)}), [])
    assert observation.outcome == Outcome.INFRA and "cannot run on a CPU" in observation.reasons[0]


def _documented(pattern: str) -> ReproSpec:
    from repros.runtime.spec import Diverges

    return ReproSpec(
        id="F99",
        title="a documented divergence",
        upstream=(),
        signatures=(Signature("F99.steps-skipped", DIVERGENCE_EXCEPTION, "optimizer_steps"),),
        expectations=(
            Expectation("bug", Outcome.REPRODUCED, {"deepspeed": "<0.19.8"}, "measured"),
            Expectation("bug", Outcome.NOT_REPRODUCED, {"deepspeed": ">=0.19.8"}, "measured"),
        ),
        diverges=(Diverges((pattern,), {"deepspeed": "<0.19.8"}, "measured"),),
    )


def test_a_strategy_a_documented_failure_makes_diverge_is_expected_to_where_its_bug_mode_reproduces() -> None:
    spec = _documented("zero[12]-bf16*")
    old = {"deepspeed": "0.19.5"}
    expected = crosscheck_expectation("zero2-bf16-accum-manual", [F1, spec], old)
    assert expected.expectation.outcome == Outcome.DIVERGES and expected.spec is spec
    assert (
        expected.names("F99.steps-skipped") and not expected.names("F1.recompute-shape-0") and not expected.names(None)
    )
    assert crosscheck_expectation("zero2-bf16", [spec], {"deepspeed": "0.19.8"}).expectation.outcome == Outcome.AGREES
    assert crosscheck_expectation("zero3-bf16", [spec], old).expectation.outcome == Outcome.AGREES


def test_a_divergence_is_named_by_the_failure_expected_there_and_elsewhere_is_a_finding() -> None:
    # ZeRO-2 accumulating by the engine diverged: F35's signature (ZeRO-1/2 accumulating) matches it as F37's
    # does (the engine accumulating), since both read the strategy's name alone.
    from repros.catalog.f35_zero2_manual_accumulation_last_only import SPEC as F35
    from repros.catalog.f37_deepspeed_gas_scaled_per_output import SPEC as F37

    message = (
        "zero2-fp32-ckpt-nr-accum-engine trains unlike one process: grad_norm at step 0: 0.252 against the "
        "reference's 0.504, relative difference 0.5 > tolerance 2.955e-05"
    )
    raised = rank_record(0, "error", phase="run", error={"type": DIVERGENCE_EXCEPTION, "message": message})
    launch = failed_launch({0: raised, 1: agreed(1)})
    known = [F1, F35, F37]
    assert classify("crosscheck", None, launch, known).signature == "F35.last-micro-batch-only"  # catalog order
    # On deepspeed 0.19.2 F37 is the one expected to make it diverge: F37 names it.
    expected = crosscheck_expectation("zero2-fp32-ckpt-nr-accum-engine", known, {"deepspeed": "0.19.2"})
    assert expected.spec is F37
    observation = classify("crosscheck", None, launch, naming_a_divergence(expected.spec, known))
    assert observation.signature == "F37.gas-scaled-per-output" and expected.names(observation.signature)
    # On 0.19.8 none is expected to: whatever diverges there is a finding, named by no failure.
    current = crosscheck_expectation("zero2-fp32-ckpt-nr-accum-engine", known, {"deepspeed": "0.19.8"})
    assert current.spec is None and current.expectation.outcome == Outcome.AGREES
    finding = classify("crosscheck", None, launch, naming_a_divergence(current.spec, known))
    assert finding.outcome == Outcome.DIVERGES and finding.signature is None
    # An error a failure's signature names is still named (F1's CheckpointError) wherever it is raised.
    assert any(s.id == "F1" and s.signatures for s in naming_a_divergence(None, known))
