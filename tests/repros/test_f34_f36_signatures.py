"""The silent failures' signatures (F34, F35, F36) on the texts real runs raised, near misses beside them, and
``explain`` naming them from what a user pastes: a training log, a crosscheck finding."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.analysis.explain.logs import logged_errors
from harness.analysis.explain.match import DOCUMENTED, explain
from harness.config.repros import discover
from repros.catalog.f34_zero_bf16_silent_skipped_step import SPEC as F34
from repros.catalog.f35_zero2_manual_accumulation_last_only import SPEC as F35
from repros.catalog.f36_8bit_state_by_shard_size import SPEC as F36
from repros.catalog.f37_deepspeed_gas_scaled_per_output import SPEC as F37

RECORDED = Path(__file__).resolve().parent.parent / "support" / "recorded"
SKIPPED = "repros.trainer.silent_failures.OptimizerStepSkippedSilently"
DIVERGED = "repros.trainer.silent_failures.TrainsUnlikeOneProcess"
F34_TEXT = (RECORDED / "f34_skipped_silently_deepspeed-0.19.3_torch-2.13.0.txt").read_text()
F35_TEXT = (RECORDED / "f35_last_micro_batch_deepspeed-0.19.8_torch-2.13.0.txt").read_text()
F36_TEXT = (RECORDED / "f36_state_by_shard_bitsandbytes-0.50.2_deepspeed-0.19.8.txt").read_text()
F37_TEXT = (RECORDED / "f37_gas_scaled_per_output_deepspeed-0.19.2_torch-2.13.0.txt").read_text()


def test_what_deepspeed_0_19_3_did_is_f34() -> None:
    assert F34.signatures[0].matches(SKIPPED, F34_TEXT)


def test_what_zero2_accumulating_by_hand_did_is_f35_and_not_f36() -> None:
    assert F35.signatures[0].matches(DIVERGED, F35_TEXT)
    assert not F36.signatures[0].matches(DIVERGED, F35_TEXT)


def test_what_zero2_with_an_8bit_optimizer_did_is_f36_and_not_f35() -> None:
    assert F36.signatures[0].matches(DIVERGED, F36_TEXT)
    assert not F35.signatures[0].matches(DIVERGED, F36_TEXT)


@pytest.mark.parametrize(
    "strategy",
    ["zero3-fp32-accum-manual", "ddp-fp32-accum-manual", "zero2-fp32", "zero0-fp32-accum-manual"],
)
def test_a_divergence_of_another_strategy_is_not_f35(strategy: str) -> None:
    assert not F35.signatures[0].matches(DIVERGED, F35_TEXT.replace("zero2-fp32-accum-manual", strategy))


@pytest.mark.parametrize("strategy", ["zero2-fp32-ckpt-nr-accum-engine", "zero1-bf16-accum-manual"])
def test_zero12_accumulating_by_the_engine_or_by_hand_is_f35(strategy: str) -> None:
    # Before 0.18.3 ZeRO-2 kept the last micro-batch however it accumulated (DeepSpeed#7718).
    assert F35.signatures[0].matches(DIVERGED, F35_TEXT.replace("zero2-fp32-accum-manual", strategy))


@pytest.mark.parametrize("strategy", ["ddp-fp32-adamw8bit", "zero0-fp32-adamw8bit", "zero2-fp32-adamw", "zero2-fp32"])
def test_a_divergence_without_sharded_8bit_state_is_not_f36(strategy: str) -> None:
    assert not F36.signatures[0].matches(DIVERGED, F36_TEXT.replace("zero2-fp32-adamw8bit", strategy))


def _explained(text: str) -> list[str]:
    found = explain(logged_errors(text), list(discover().repros.values()))
    return [m.repro.id for m in found.matches if m.status == DOCUMENTED]


def test_explain_names_f34_from_a_trainer_log_whose_gradient_norm_is_nan_beside_a_flat_loss() -> None:
    log = (RECORDED / "f34_hf_trainer_log_grad_norm_nan_deepspeed-0.19.5.log").read_text()
    assert _explained(log) == ["F34"]


def test_explain_names_f34_from_deepspeeds_own_count_of_skipped_steps() -> None:
    log = "[2026-09-04 10:12:01,123] [INFO] [logging.py:107:log_dist] [Rank 0] step=10, skipped=10, lr=[1e-05]\n"
    assert _explained(log) == ["F34"]


def test_a_log_that_says_the_step_was_skipped_is_not_a_silent_skip() -> None:
    log = (RECORDED / "f34_hf_trainer_log_grad_norm_nan_deepspeed-0.19.5.log").read_text()
    said = (
        "[2026-09-04 10:12:02,001] [WARNING] [logging.py:123:log_dist] [Rank 0] [deepspeed] OVERFLOW! Skipping step. "
        "Gradients are non-finite, weights were not updated.\n"
    )
    assert "F34" not in _explained(said + log)


def test_a_healthy_log_shows_no_symptom() -> None:
    log = "\n".join(f"{{'loss': {2.3 - i / 10:.4f}, 'grad_norm': 0.{i + 3}, 'learning_rate': 1e-05}}" for i in range(6))
    assert logged_errors(log) == []


def test_explain_names_f35_and_f36_from_a_crosscheck_finding_pasted() -> None:
    for text, repro in ((F35_TEXT, "F35"), (F36_TEXT, "F36")):
        pasted = f'Traceback (most recent call last):\n  File "train.py", line 9, in <module>\n{DIVERGED}: {text}'
        assert _explained(pasted) == [repro]


def test_explain_names_f37_and_f35_from_a_zero1_engine_accumulation_finding_pasted() -> None:
    # Both shapes of lost gradient fit a ZeRO-1 strategy whose engine accumulates: F35's (0.17.6 - 0.18.2) and F37's
    # (0.18.3 - 0.19.5); a log says no release, so both are named.
    pasted = f'Traceback (most recent call last):\n  File "train.py", line 9, in <module>\n{DIVERGED}: {F37_TEXT}'
    assert sorted(_explained(pasted)) == ["F35", "F37"]


def test_what_zero1_accumulating_by_the_engine_did_on_deepspeed_0_19_2_is_f37_and_not_f36() -> None:
    assert F37.signatures[0].matches(DIVERGED, F37_TEXT)
    assert not F36.signatures[0].matches(DIVERGED, F37_TEXT)


@pytest.mark.parametrize(
    "strategy",
    ["zero1-fp32-accum-manual", "zero3-fp32-accum-engine", "ddp-fp32-accum-engine", "fsdp2-fp32-accum-engine"],
)
def test_a_divergence_the_engines_hooks_do_not_cause_is_not_f37(strategy: str) -> None:
    # By hand the hooks see a loss scaled once; ZeRO-3 agreed; DDP and FSDP have no such hooks.
    assert not F37.signatures[0].matches(DIVERGED, F37_TEXT.replace("zero1-fp32-accum-engine", strategy))
