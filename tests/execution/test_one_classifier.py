"""One classifier: whatever the item, its outcome comes from one decision tree of named steps
(``harness/execution/classify.py``), the steps its docstring lists, in that order."""

from __future__ import annotations

import ast
import re

import pytest

from harness.execution import classify as classifier
from harness.execution.classify import STEPS, classify
from repros.catalog.f1_zero3_frozen_ckpt import SPEC as F1
from repros.runtime.outcomes import Outcome
from tests.support.paths import REPO_ROOT
from tests.support.rank_records import error_record, failed_launch

CKPT = "torch.utils.checkpoint.CheckpointError"
F1_TEXT = (
    "torch.utils.checkpoint: Recomputed values for the following tensors have different metadata than during "
    "the forward pass.\ntensor at position 4:\nsaved metadata: {'shape': torch.Size([64]), "
    "'dtype': torch.bfloat16, 'device': device(type='cpu')}\nrecomputed metadata: {'shape': torch.Size([0]), "
    "'dtype': torch.bfloat16, 'device': device(type='cpu')}\n"
)


def test_the_execution_layer_defines_one_classify() -> None:
    defined = [
        (path.name, node.name)
        for path in (REPO_ROOT / "harness" / "execution").rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef) and node.name.startswith("classify")
    ]
    assert defined == [("classify.py", "classify")]


def test_the_docstring_lists_the_steps_the_tree_runs_in_order() -> None:
    lines = (classifier.__doc__ or "").splitlines()
    rules = [i for i, line in enumerate(lines) if line.startswith("=====")]
    body = lines[rules[1] + 1 : rules[2]]
    listed = [re.split(r"\s{2,}", line)[0] for line in body if line and not line.startswith(" ")]
    assert listed == [step.name for step in STEPS]


def test_one_error_is_judged_by_each_kind_of_item() -> None:
    """The same rank error: REPRODUCED for the repro's bug mode and a scenario (named by the signature),
    FAIL in fixed mode (no signature is looked for), DIVERGES named by it for a crosscheck strategy."""
    launch = failed_launch({0: error_record(0, CKPT, F1_TEXT)})
    assert classify("bug", F1, launch).signature == "F1.recompute-shape-0"
    assert classify("fixed", F1, launch).outcome == Outcome.FAIL
    scenario = classify("scenario", None, launch, [F1])
    assert (scenario.outcome, scenario.signature) == (Outcome.REPRODUCED, "F1.recompute-shape-0")
    strategy = classify("crosscheck", None, launch, [F1])
    assert (strategy.outcome, strategy.signature) == (Outcome.DIVERGES, "F1.recompute-shape-0")
    assert classify("crosscheck", None, launch, []).signature is None


def test_a_damaged_environment_is_infra_and_keeps_the_error_the_ranks_raised() -> None:
    launch = failed_launch({0: error_record(0, CKPT, F1_TEXT)})
    seen = classify("bug", F1, launch, damage="the cell's environment changed while the item ran: peft")
    assert seen.outcome == Outcome.INFRA and seen.reasons == (
        "the cell's environment changed while the item ran: peft",
    )
    assert seen.error is not None and seen.error.type == CKPT


def test_what_was_not_launched_and_what_attempts_said_come_from_the_same_tree() -> None:
    assert classify("bug", F1, no_environment="no such peft").outcome == Outcome.UNRESOLVABLE
    assert classify("fixed", F1, not_started="the node was lost").outcome == Outcome.INFRA
    assert classify("bug", F1, attempts=["REPRODUCED", "REPRODUCED"]).outcome == Outcome.REPRODUCED
    flaky = classify("bug", F1, attempts=["REPRODUCED", "DIFFERENT_ERROR", "REPRODUCED"], expected="REPRODUCED")
    assert flaky.outcome == Outcome.FLAKY
    assert flaky.reasons == ("attempts disagree: 2 REPRODUCED, 1 DIFFERENT_ERROR (attempts 2 not REPRODUCED)",)


def test_an_unknown_kind_or_nothing_to_judge_is_refused() -> None:
    with pytest.raises(ValueError, match="no such kind"):
        classify("explore", F1, failed_launch({0: None}))
    with pytest.raises(ValueError, match="nothing to classify"):
        classify("bug", F1)
