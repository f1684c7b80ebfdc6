"""Outcome classification on recorded failure texts, near-misses included."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.execution.classify import classify, judge_training
from harness.execution.launchers.result import LaunchResult
from harness.records.rank import RankRecord
from repros.catalog.f1_zero3_frozen_ckpt import SPEC as F1
from repros.runtime.signatures import metadata_mismatches, recomputed_shapes_are_empty
from tests.support.rank_records import error_record, rank_record

RECORDED = Path(__file__).resolve().parent.parent / "support" / "recorded"
F1_TEXT = (RECORDED / "f1_checkpoint_error_torch-2.13.0_deepspeed-0.19.2.txt").read_text()
CKPT = "torch.utils.checkpoint.CheckpointError"


def good_train() -> dict[str, Any]:
    return {
        "losses": [4.87, 4.82, 4.75],
        "adapter_grad_norms": {"a.lora_A": [0.0, 0.01, 0.02], "a.lora_B": [0.3, 0.2, 0.1]},
        "adapter_weight_delta": {"a.lora_A": 0.01, "a.lora_B": 0.02},
    }


def rank(r: int, status: str = "ok", *, train: dict[str, Any] | None = None, **extra: Any) -> RankRecord:
    facts = {"facts": {"train": train}} if train is not None else {}
    return rank_record(r, status, phase="run", **facts, **extra)


def error_rank(r: int, etype: str, message: str, phase: str = "run") -> RankRecord:
    return error_record(r, etype, message, phase=phase)


def launch(
    records: dict[int, RankRecord | None],
    *,
    timed_out: bool = False,
    returncode: int | None = 0,
    exitcodes: dict[int, int] | None = None,
) -> LaunchResult:
    return LaunchResult(
        command=["torchrun"],
        returncode=returncode,
        timed_out=timed_out,
        wall_s=1.0,
        world_size=len(records),
        records=records,
        rank_exitcodes=exitcodes or {},
    )


def test_recorded_f1_text_parses_into_shape_zero_pairs() -> None:
    pairs = metadata_mismatches(F1_TEXT)
    assert len(pairs) >= 1
    assert all(p.recomputed.shape == (0,) and p.saved.shape for p in pairs)
    assert recomputed_shapes_are_empty(F1_TEXT)


def test_recorded_f1_failure_is_reproduced() -> None:
    obs = classify("bug", F1, launch({0: error_rank(0, CKPT, F1_TEXT), 1: error_rank(1, CKPT, F1_TEXT)}, returncode=1))
    assert obs.outcome == "REPRODUCED" and obs.signature == "F1.recompute-shape-0"
    assert obs.error.first_line.startswith("torch.utils.checkpoint: Recomputed values")


def test_one_rank_reproducing_while_its_peer_was_stopped_is_reproduced() -> None:
    obs = classify(
        "bug",
        F1,
        launch({0: error_rank(0, CKPT, F1_TEXT), 1: rank(1, "running")}, returncode=1, exitcodes={0: 1, 1: -15}),
    )
    assert obs.outcome == "REPRODUCED"


NEAR_MISSES = {
    "recomputed shape not empty": F1_TEXT.replace("torch.Size([0])", "torch.Size([32])"),
    "dtype flipped, shapes agree (F2's symptom)": (
        "torch.utils.checkpoint: Recomputed values for the following tensors have different metadata than during "
        "the forward pass.\ntensor at position 3:\nsaved metadata: {'shape': torch.Size([2, 16, 64]), 'dtype': "
        "torch.float32, 'device': device(type='cpu')}\nrecomputed metadata: {'shape': torch.Size([2, 16, 64]), "
        "'dtype': torch.bfloat16, 'device': device(type='cpu')}\n"
    ),
    "shape [0] but the dtype changed too": F1_TEXT.replace(
        "recomputed metadata: {'shape': torch.Size([0]), 'dtype': torch.bfloat16",
        "recomputed metadata: {'shape': torch.Size([0]), 'dtype': torch.float32",
        1,
    ),
    "no metadata lines at all": "torch.utils.checkpoint: Recomputed values for the following tensors have "
    "different metadata than during the forward pass.\n",
    "saved shape already empty": F1_TEXT.replace(
        "saved metadata: {'shape': torch.Size([64])", "saved metadata: {'shape': torch.Size([0])"
    ),
}


@pytest.mark.parametrize("case", sorted(NEAR_MISSES))
def test_near_misses_are_a_different_error(case: str) -> None:
    obs = classify("bug", F1, launch({0: error_rank(0, CKPT, NEAR_MISSES[case])}, returncode=1))
    assert obs.outcome == "DIFFERENT_ERROR"
    assert obs.error.type == CKPT


def test_the_right_text_from_the_wrong_exception_type_does_not_count() -> None:
    obs = classify("bug", F1, launch({0: error_rank(0, "RuntimeError", F1_TEXT)}, returncode=1))
    assert obs.outcome == "DIFFERENT_ERROR" and obs.error.type == "RuntimeError"
    assert obs.error.first_line.startswith("torch.utils.checkpoint")


def test_clean_bug_run_is_not_reproduced() -> None:
    obs = classify("bug", F1, launch({0: rank(0, train=good_train()), 1: rank(1, train=good_train())}))
    assert obs.outcome == "NOT_REPRODUCED"


def test_timeout_is_a_hang() -> None:
    obs = classify(
        "bug", F1, launch({0: rank(0, "running"), 1: error_rank(1, CKPT, F1_TEXT)}, timed_out=True, returncode=None)
    )
    assert obs.outcome == "HANG"


def test_rank_killed_by_a_signal_is_a_crash_not_its_peers_error() -> None:
    peer_error = error_rank(0, "RuntimeError", "Connection closed by peer [127.0.0.1]:29500")
    obs = classify("bug", F1, launch({0: peer_error, 1: rank(1, "running")}, returncode=1, exitcodes={0: 1, 1: -9}))
    assert obs.outcome == "CRASH" and "rank 1" in obs.reasons[0] and "SIGKILL" in obs.reasons[0]


def test_rank_vanishing_without_a_record_is_a_crash() -> None:
    obs = classify("fixed", F1, launch({0: rank(0, train=good_train()), 1: rank(1, "running")}, returncode=1))
    assert obs.outcome == "CRASH"


def test_failures_before_the_scenario_are_infra() -> None:
    for phase in ("setup", "import"):
        obs = classify(
            "bug", F1, launch({0: error_rank(0, "ModuleNotFoundError", "No module named 'x'", phase)}, returncode=1)
        )
        assert obs.outcome == "INFRA", phase
    obs = classify("bug", F1, launch({0: error_rank(0, "torch.OutOfMemoryError", "CUDA out of memory")}, returncode=1))
    assert obs.outcome == "INFRA"
    obs = classify("fixed", F1, launch({0: rank(0, "unavailable", unavailable_reason="needs 2 GPUs")}, returncode=3))
    assert obs.outcome == "INFRA" and "needs 2 GPUs" in obs.reasons[0]
    obs = classify("fixed", F1, launch({0: None, 1: None}, returncode=1))
    assert obs.outcome == "INFRA"


def test_fixed_mode_passes_only_on_real_training() -> None:
    obs = classify("fixed", F1, launch({0: rank(0, train=good_train()), 1: rank(1, train=good_train())}))
    assert obs.outcome == "PASS"


def mutate(change: dict[str, Any]) -> dict[str, Any]:
    train = good_train()
    for key, value in change.items():
        train[key] = value
    return train


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"losses": [4.8, 4.8, 4.9]}, "loss did not decrease"),
        ({"losses": [4.8, "nan", 4.1]}, "losses not finite"),
        (
            {"adapter_grad_norms": {"a.lora_A": [None, None, None], "a.lora_B": [0.3, 0.2, 0.1]}},
            "a.lora_A got no gradient",
        ),
        ({"adapter_grad_norms": {"a.lora_A": [0.0, 0.0, 0.0], "a.lora_B": [0.3, 0.2, 0.1]}}, "only zero gradients"),
        ({"adapter_grad_norms": {"a.lora_A": [0.1, "inf", 0.1], "a.lora_B": [0.3, 0.2, 0.1]}}, "non-finite"),
        ({"adapter_weight_delta": {"a.lora_A": 0.0, "a.lora_B": 0.02}}, "a.lora_A did not change"),
        ({"adapter_grad_norms": {}}, "no adapter parameters"),
    ],
)
def test_fixed_mode_fails_on_each_missing_fact(change: dict[str, Any], needle: str) -> None:
    problems = judge_training([rank(0, train=mutate(change))])
    assert any(needle in p for p in problems), problems
    obs = classify("fixed", F1, launch({0: rank(0, train=mutate(change))}))
    assert obs.outcome == "FAIL"


def test_fixed_mode_exception_is_a_fail_with_the_error() -> None:
    obs = classify("fixed", F1, launch({0: error_rank(0, CKPT, F1_TEXT)}, returncode=1))
    assert obs.outcome == "FAIL" and obs.error.type == CKPT
