"""F24-F32: their signatures on recorded failure texts and the upstream threads' wordings, ``explain`` naming each
from a traceback a user pastes, the near-misses, and the guards that work around them.

Recorded texts (tests/support/recorded/), each the failing rank's message in a harness run (torch 2.13.0 CPU,
2 ranks, gloo, 2026-11-27): F26 in ``sp-ds-0.18.1`` (os.stat's wording, transformers 5.23.0), F27 in
``sp-ds-0.18.1``, F29 in ``peft-0.20.0``, F30 in ``torchao-peft-0.18.1``, F31 in ``trl-1.6.0-fsdp2``, F32 in
``tf-5.0.0`` (silent) and ``tf-5.1.0``. The others are the threads' own wordings: none of these failures is
raised by a collective, so NCCL and gloo word them alike. F24, F25 and F28 need CUDA: their CPU runs are INFRA
(tested in tests/integration), their signatures are tested here on the threads' texts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from harness.analysis.explain.logs import logged_errors
from harness.analysis.explain.match import DOCUMENTED, PROBABLE, explain
from harness.config.repros import discover
from harness.execution.classify import DIFFERENT_ERROR, REPRODUCED, classify
from harness.execution.launchers.result import LaunchResult
from repros.catalog.f24_fsdp2_nf4_bf16_nan_canonical import SCENARIO as F24_SCENARIO
from repros.catalog.f25_zero3_liger_lm_head_shard import SCENARIO as F25_SCENARIO
from repros.catalog.f26_ulysses_peft_register import SCENARIO as F26_SCENARIO
from repros.catalog.f27_ulysses_zero0_mpu import SCENARIO as F27_SCENARIO
from repros.catalog.f28_fsdp2_context_parallel_skipped import SCENARIO as F28_SCENARIO
from repros.catalog.f29_zero3_target_parameters_shape import SCENARIO as F29_SCENARIO
from repros.catalog.f29_zero3_target_parameters_shape import SPEC as F29
from repros.catalog.f30_peft_torchao_import import SCENARIO as F30_SCENARIO
from repros.catalog.f31_fsdp2_peft_chunked_nll_dtensor import SCENARIO as F31_SCENARIO
from repros.catalog.f32_zero3_load_conversion_missing import SCENARIO as F32_SCENARIO
from repros.trainer.guards import Versions, apply_guards, choose_guards
from repros.trainer.scenario import Scenario
from tests.support.rank_records import error_record, failed_launch

RECORDED = Path(__file__).resolve().parent.parent / "support" / "recorded"
REPROS = list(discover().repros.values())
SPECS = {r.id: r.spec for r in REPROS}


def recorded(name: str) -> str:
    return (RECORDED / name).read_text().strip()


#: (documented failure, signature, the type a traceback prints, the message): recorded runs and upstream wordings.
TEXTS = [
    (
        "F24",
        "F24.sharded-forward-differs",
        "repros.trainer.silent_failures.ShardedForwardDiffers",
        "forward differs after fully_shard: max |logits diff| 0.3125; 12 of 18432 packed 4-bit elements "
        "(torch.bfloat16) were bf16 NaN bit patterns",
    ),
    # TRL#3368 (GRPO + Liger under ZeRO-3, as reported).
    ("F25", "F25.liger-empty-lm-head", "RuntimeError", "size mismatch, got input (s2x2048), vec (0)"),
    ("F25", "F25.liger-empty-lm-head", "RuntimeError", "size mismatch, got input (2x2048), vec (0)"),
    # DeepSpeed#7729 / accelerate#3889.
    ("F26", "F26.peft-model-as-path", "TypeError", "expected str, bytes or os.PathLike object, not PeftModel"),
    ("F26", "F26.peft-model-as-path", "TypeError", "recorded:f26_peft_model_as_path_deepspeed-0.18.1.txt"),
    # DeepSpeed#7833.
    (
        "F27",
        "F27.mpu-model-parallel-rank",
        "AttributeError",
        "module 'deepspeed.runtime.sequence_parallel.parallel_state_sp' has no attribute 'get_model_parallel_rank'",
    ),
    (
        "F27",
        "F27.mpu-model-parallel-rank",
        "AttributeError",
        "recorded:f27_mpu_model_parallel_group_deepspeed-0.18.1.txt",
    ),
    # accelerate#3856 / #3867.
    ("F28", "F28.no-cp-context", "AttributeError", "'Accelerator' object has no attribute '_cp_context'"),
    # unsloth PR #11168's traceback, and this harness's run.
    (
        "F30",
        "F30.laqt-import",
        "ImportError",
        "cannot import name 'LinearActivationQuantizedTensor' from 'torchao.quantization'",
    ),
    ("F30", "F30.laqt-import", "ImportError", "recorded:f30_laqt_import_peft-0.18.1_torchao-0.18.0.txt"),
    # TRL#6064 (its CI, NCCL) and this harness's run (gloo).
    (
        "F31",
        "F31.mixed-tensor-dtensor",
        "RuntimeError",
        "aten.mm.default got mixed torch.Tensor and DTensor, need to convert all torch.Tensor to DTensor before "
        "calling distributed operators!",
    ),
    ("F31", "F31.mixed-tensor-dtensor", "RuntimeError", "recorded:f31_mixed_tensor_dtensor_trl-1.6.0.txt"),
    (
        "F32",
        "F32.loaded-not-checkpoint",
        "repros.trainer.silent_failures.LoadedNotCheckpoint",
        "recorded:f32_loaded_not_checkpoint_transformers-5.0.0_deepspeed-0.19.8.txt",
    ),
    (
        "F32",
        "F32.conversion-unpack",
        "RuntimeError",
        "recorded:f32_conversion_unpack_transformers-5.1.0_deepspeed-0.19.8.txt",
    ),
]


def message_of(text: str) -> str:
    return recorded(text.removeprefix("recorded:")) if text.startswith("recorded:") else text


def traceback_of(etype: str, message: str) -> str:
    return "\n".join(
        [
            "Traceback (most recent call last):",
            '  File "/home/me/train.py", line 51, in <module>',
            "    main()",
            f"{etype}: {message}",
        ]
    )


def launch_of(etype: str, message: str, facts: dict[str, Any] | None = None) -> LaunchResult:
    return failed_launch({0: error_record(0, etype, message, facts=facts)}, exitcodes={0: 1})


@pytest.mark.parametrize(("repro", "signature", "etype", "text"), TEXTS)
def test_each_text_is_its_failure_in_a_run_and_in_explain(repro: str, signature: str, etype: str, text: str) -> None:
    message = message_of(text)
    observed = classify("bug", SPECS[repro], launch_of(etype, message))
    assert (observed.outcome, observed.signature) == (REPRODUCED, signature)
    found = explain(logged_errors(traceback_of(etype, message)), REPROS)
    assert [(m.repro.id, m.signature.id, m.status) for m in found.matches] == [(repro, signature, DOCUMENTED)]


def test_f29_needs_what_the_run_recorded_and_explain_says_so() -> None:
    message = recorded("f29_param_wrapper_shape_peft-0.20.0_deepspeed-0.19.8.txt")
    facts = {"engine": "deepspeed", "zero_init": True, "target_parameters": ["mlp.experts.gate_up_proj"]}
    observed = classify("bug", F29, launch_of("IndexError", message, facts))
    assert (observed.outcome, observed.signature) == (REPRODUCED, "F29.param-wrapper-shape")
    # The same common message from a run that wrapped no parameters by name is another failure.
    plain = {"engine": "deepspeed", "zero_init": True, "target_parameters": []}
    assert classify("bug", F29, launch_of("IndexError", message, plain)).outcome == DIFFERENT_ERROR
    (match,) = explain(logged_errors(traceback_of("IndexError", message)), REPROS).matches
    assert (match.repro.id, match.status) == ("F29", PROBABLE)
    assert "target_parameters" in match.why


@pytest.mark.parametrize(
    ("etype", "message"),
    [
        # A PEFT model handed to some other path-taking call names another type.
        ("TypeError", "expected str, bytes or os.PathLike object, not NoneType"),
        # Another module's missing attribute is not the Ulysses mpu's.
        ("AttributeError", "module 'megatron.core.parallel_state' has no attribute 'get_model_parallel_rank'"),
        # Another class torchao removed is not the one PEFT's dispatcher imports.
        ("ImportError", "cannot import name 'Int8WeightOnlyConfig' from 'torchao.quantization'"),
        # A mixed-type DTensor error of another operator (the embedding under tensor parallelism).
        ("RuntimeError", "aten.embedding.default: got mixed torch.Tensor and DTensor"),
        # A shape mismatch with a non-empty vector is an ordinary one.
        ("RuntimeError", "size mismatch, got input (2x2048), vec (64)"),
    ],
)
def test_near_misses_are_no_documented_failure(etype: str, message: str) -> None:
    found = explain(logged_errors(traceback_of(etype, message)), REPROS)
    assert [m for m in found.matches if m.status == DOCUMENTED] == []


def at(**found: str) -> Versions:
    names = ("torch", "deepspeed", "peft", "transformers", "accelerate", "bitsandbytes", "torchao", "trl")
    return {name: Version(found[name]) if name in found else None for name in names}


CURRENT = {"torch": "2.13.0", "deepspeed": "0.19.8", "peft": "0.21.2", "transformers": "5.23.0", "accelerate": "1.15.0"}


@pytest.mark.parametrize(
    ("scenario", "guard", "affected", "fixed", "field", "value"),
    [
        (F24_SCENARIO, "bnb-4bit-uint8-storage-fsdp2", {}, {"torch": "2.11.0"}, "bnb_4bit_quant_storage", "uint8"),
        (F25_SCENARIO, "liger-loss-off-under-zero3", {"trl": "1.5.1"}, {"trl": "1.6.0"}, "liger_loss", False),
        (
            F26_SCENARIO,
            "ulysses-register-base-model",
            {"deepspeed": "0.18.3"},
            {"deepspeed": "0.18.4"},
            "ulysses_register_base_model",
            True,
        ),
        (F27_SCENARIO, "ulysses-zero1-not-zero0", {"deepspeed": "0.18.1"}, {"deepspeed": "0.18.2"}, "zero_stage", 1),
        (
            F28_SCENARIO,
            "accelerate-cp-context",
            {"accelerate": "1.12.0"},
            {"accelerate": "1.13.0"},
            "accelerate_cp_clear_sp_backend",
            True,
        ),
        (
            F29_SCENARIO,
            "zero3-target-parameters-load-whole",
            {"peft": "0.20.0"},
            {"peft": "0.21.0"},
            "zero_init",
            False,
        ),
        (
            F30_SCENARIO,
            "peft-torchao-dispatch-checked",
            {"peft": "0.18.1", "torchao": "0.18.0"},
            {"peft": "0.19.0", "torchao": "0.18.0"},
            "peft_torchao_dispatch_checked",
            True,
        ),
        (F31_SCENARIO, "trl-nll-under-fsdp2-peft", {"trl": "1.6.0"}, {"trl": "1.7.0"}, "trl_chunked_nll", False),
        (
            F32_SCENARIO,
            "zero3-load-whole-then-partition",
            {"transformers": "5.1.0"},
            {"transformers": "5.2.0"},
            "zero_init",
            False,
        ),
    ],
    ids=["F24", "F25", "F26", "F27", "F28", "F29", "F30", "F31", "F32"],
)
def test_each_guard_applies_where_its_failure_does_and_not_where_it_is_fixed(
    scenario: Scenario, guard: str, affected: dict[str, str], fixed: dict[str, str], field: str, value: Any
) -> None:
    guards = choose_guards(scenario, at(**(CURRENT | affected)))
    assert guard in [g.id for g in guards]
    assert getattr(apply_guards(scenario, guards), field) == value
    assert all(g.reason for g in guards)
    assert guard not in [g.id for g in choose_guards(scenario, at(**(CURRENT | fixed)))]


def test_f30_guard_needs_torchao_0_18_beside_an_old_peft() -> None:
    without = choose_guards(F30_SCENARIO, at(**(CURRENT | {"peft": "0.18.1"})))
    older = choose_guards(F30_SCENARIO, at(**(CURRENT | {"peft": "0.18.1", "torchao": "0.17.0"})))
    assert "peft-torchao-dispatch-checked" not in [g.id for g in without + older]


def test_f24_guard_leaves_torch_before_2_12_to_f14s_bf16_storage() -> None:
    """On torch < 2.12 FSDP2 cannot shard uint8 (F14): F14's guard stores bf16 there and F24's stays away."""
    uint8 = Scenario(engine="fsdp2", quantization="nf4")
    ids = [g.id for g in choose_guards(uint8, at(**(CURRENT | {"torch": "2.11.0"})))]
    assert "bnb-4bit-storage-compute-dtype" in ids and "bnb-4bit-uint8-storage-fsdp2" not in ids
