"""F14: its signature on the recorded failure text and on near-misses, the guard that works around it,
and the accelerate path it needs on a CPU.

Recorded text (tests/support/recorded/): ``f14_uint8_requires_grad_...``, the failing rank's message in a
harness run of F14's bug mode in cell ``torch-2.11-acc-1.13`` (torch 2.11.0 run on CPU, accelerate 1.13.0,
2 ranks, gloo, 2026-11-26). The NCCL run (H200, 1 rank, ``accelerator.prepare``) printed the same words.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from harness.analysis.explain.logs import logged_errors
from harness.analysis.explain.match import PROBABLE, explain
from harness.config.expectations import expectation_for
from harness.config.repros import discover
from harness.execution.classify import DIFFERENT_ERROR, REPRODUCED, classify
from repros.catalog.f14_fsdp2_qlora_uint8_storage import SCENARIO, fsdp2_with_4bit
from repros.catalog.f14_fsdp2_qlora_uint8_storage import SPEC as F14
from repros.runtime.outcomes import Outcome
from repros.trainer.guards import GUARDS, Versions, apply_guards, choose_guards
from tests.support.rank_records import error_record, failed_launch

RECORDED = Path(__file__).resolve().parent.parent / "support" / "recorded"
TEXT = (RECORDED / "f14_uint8_requires_grad_torch-2.11.0_accelerate-1.13.0.txt").read_text()
#: What the failing ranks recorded about their scenario (the fixed trainer's ``scenario_facts``).
FACTS = {"engine": "fsdp2", "quantization": "nf4", "bnb_4bit_quant_storage": None, "fsdp2_accelerate_prepare": True}


def observed(etype: str, message: str, facts: dict[str, Any] | None) -> tuple[str, str | None]:
    launch = failed_launch({r: error_record(r, etype, message, facts=facts) for r in (0, 1)}, exitcodes={0: 1, 1: 1})
    obs = classify("bug", F14, launch)
    return obs.outcome, obs.signature


def versions(**found: str) -> Versions:
    return {name: Version(v) for name, v in found.items()}


def test_the_recorded_text_of_an_fsdp2_4bit_run_is_f14() -> None:
    assert observed("RuntimeError", TEXT, FACTS) == (REPRODUCED, "F14.uint8-requires-grad")


@pytest.mark.parametrize(
    "facts",
    [
        {**FACTS, "engine": "deepspeed"},  # an int tensor asked to require grad elsewhere
        {**FACTS, "quantization": None},
        {**FACTS, "quantization": "int8"},
        None,
    ],
    ids=["deepspeed", "unquantized", "8-bit", "no-facts"],
)
def test_the_same_words_outside_an_fsdp2_4bit_run_are_not_f14(facts: dict[str, Any] | None) -> None:
    assert observed("RuntimeError", TEXT, facts)[0] == DIFFERENT_ERROR


def test_another_requires_grad_refusal_is_not_f14() -> None:
    other = "element 0 of tensors does not require grad and does not have a grad_fn"
    assert observed("RuntimeError", other, FACTS)[0] == DIFFERENT_ERROR
    assert not fsdp2_with_4bit({"engine": "fsdp2"})


def test_explain_names_f14_as_probable_and_says_what_the_run_must_have_recorded() -> None:
    log = f'Traceback (most recent call last):\n  File "train.py", line 3, in <module>\nRuntimeError: {TEXT}\n'
    (match,) = explain(logged_errors(log), list(discover().repros.values())).matches
    assert (match.repro.id, match.signature.id, match.status) == ("F14", "F14.uint8-requires-grad", PROBABLE)
    assert "which a log does not hold" in match.why


@pytest.mark.parametrize(
    ("torch", "accelerate", "outcome"),
    [
        ("2.11.0", "1.13.0", Outcome.REPRODUCED),
        ("2.11.0", "1.6.0", Outcome.REPRODUCED),
        ("2.11.0", "1.14.0", Outcome.NOT_REPRODUCED),
        ("2.12.1", "1.13.0", Outcome.NOT_REPRODUCED),
        ("2.13.0", "1.15.0", Outcome.NOT_REPRODUCED),
    ],
)
def test_expected_outcome_follows_torch_and_accelerate(torch: str, accelerate: str, outcome: str) -> None:
    found = expectation_for(F14, "bug", {"torch": torch, "accelerate": accelerate})
    assert found is not None and found.outcome == outcome


@pytest.mark.parametrize(
    ("torch", "accelerate", "guarded"),
    [
        ("2.11.0", "1.13.0", True),
        ("2.11.0", "1.7.0", True),
        ("2.11.0", "1.14.0", False),  # accelerate leaves the 4-bit weights out of the sharding
        ("2.12.0", "1.13.0", False),  # torch shards uint8
        ("2.13.0", "1.15.0", False),
    ],
)
def test_guard_stores_4bit_weights_in_bf16_where_fsdp2_would_refuse_them(
    torch: str, accelerate: str, guarded: bool
) -> None:
    at = versions(torch=torch, accelerate=accelerate)
    chosen = [g.id for g in choose_guards(SCENARIO, at)]
    assert ("bnb-4bit-storage-compute-dtype" in chosen) is guarded
    storage = apply_guards(SCENARIO, choose_guards(SCENARIO, at)).bnb_4bit_quant_storage
    assert storage == ("bfloat16" if guarded else None)


def test_guard_covers_the_trainers_own_fully_shard_whatever_accelerate_does() -> None:
    own = replace(SCENARIO, fsdp2_accelerate_prepare=False)
    at = versions(torch="2.11.0", accelerate="1.15.0")
    assert "bnb-4bit-storage-compute-dtype" in [g.id for g in choose_guards(own, at)]
    # Not for 8-bit, an unquantized model, another engine, or storage the user already chose.
    for other in (
        replace(own, quantization="int8"),
        replace(own, quantization=None),
        replace(own, engine="ddp"),
        replace(own, bnb_4bit_quant_storage="bfloat16"),
    ):
        assert "bnb-4bit-storage-compute-dtype" not in [g.id for g in choose_guards(other, at)]


def test_guard_names_f14() -> None:
    (rule,) = [r for r in GUARDS.values() if r.id == "bnb-4bit-storage-compute-dtype"]
    assert rule.works_around == "F14" and "F14" in rule.reason(versions(torch="2.11.0"))
