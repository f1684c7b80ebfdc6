"""F19: its signature on the texts a GPU run printed, its near-misses, the guard that works around it,
and its two paths: INFRA on a CPU, the fixed trainer on CUDA (run here with a stand-in for the trainer,
since this machine has no GPU).

Recorded texts (tests/support/recorded/), both from an H200 (torch 2.11.0+cu130, transformers 5.17.0,
peft 0.21.0, 2026-11-26, LoRA dropout 0.1, non-reentrant checkpointing, ``torch.compile``):
- ``f19_inductor_passmanager_...``: compiled in the process (``TORCHINDUCTOR_COMPILE_THREADS=1``);
- ``f19_inductor_subproc_passmanager_...``: compiled in inductor's worker processes (the default), the
  worker's traceback inside the message.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from harness.config.expectations import expectation_for
from harness.execution.classify import DIFFERENT_ERROR, REPRODUCED, classify
from repros.catalog import f19_lora_ckpt_compile_dropout as f19
from repros.catalog.f19_lora_ckpt_compile_dropout import CPU_REASON, SCENARIO
from repros.catalog.f19_lora_ckpt_compile_dropout import SPEC as F19
from repros.runtime.outcomes import Outcome
from repros.runtime.record import ScenarioUnavailable
from repros.trainer.guards import GUARDS, choose_guards
from repros.trainer.scenario import Scenario
from tests.support.rank_records import error_record, failed_launch

RECORDED = Path(__file__).resolve().parent.parent / "support" / "recorded"
IN_PROCESS = (RECORDED / "f19_inductor_passmanager_cuda_torch-2.11.0_peft-0.21.0.txt").read_text()
IN_WORKER = (RECORDED / "f19_inductor_subproc_passmanager_cuda_torch-2.11.0_peft-0.21.0.txt").read_text()
INDUCTOR_ERROR = "torch._inductor.exc.InductorError"
GUARD = "lora-dropout-off-under-compile"


def observed(etype: str, message: str) -> tuple[str, str | None]:
    obs = classify("bug", F19, failed_launch({0: error_record(0, etype, message)}, exitcodes={0: 1}))
    return obs.outcome, obs.signature


@pytest.mark.parametrize("text", [IN_PROCESS, IN_WORKER], ids=["in-process", "compile-worker"])
def test_both_recorded_gpu_texts_are_f19(text: str) -> None:
    assert observed(INDUCTOR_ERROR, text) == (REPRODUCED, "F19.passmanager-run-failed")


def test_other_inductor_errors_and_a_bare_triton_error_are_not_f19() -> None:
    assert observed(INDUCTOR_ERROR, "AssertionError: Node slice_948 was invalid, but is output")[0] == DIFFERENT_ERROR
    assert observed("RuntimeError", IN_PROCESS)[0] == DIFFERENT_ERROR


@pytest.mark.parametrize(
    ("mode", "device", "torch", "outcome"),
    [
        ("bug", "cpu", "2.13.0", Outcome.INFRA),
        ("fixed", "cpu", "2.11.0", Outcome.INFRA),
        ("bug", "cuda", "2.11.0", Outcome.REPRODUCED),
        ("bug", "cuda", "2.8.0", Outcome.REPRODUCED),
        ("fixed", "cuda", "2.13.0", Outcome.PASS),
    ],
)
def test_expectations_are_infra_on_a_cpu_and_the_failure_on_cuda(
    mode: str, device: str, torch: str, outcome: str
) -> None:
    found = expectation_for(F19, mode, {"torch": torch}, device)
    assert found is not None and found.outcome == outcome


def test_cuda_releases_nobody_has_run_have_no_expectation_so_a_gpu_run_is_a_finding() -> None:
    assert expectation_for(F19, "bug", {"torch": "2.13.0"}, "cuda") is None


def test_guard_turns_dropout_off_only_when_compiled_under_checkpointing() -> None:
    at = {"torch": Version("2.11.0")}
    assert GUARD in [g.id for g in choose_guards(SCENARIO, at)]
    for other in (
        replace(SCENARIO, lora_dropout=0.0),
        replace(SCENARIO, gradient_checkpointing=False),
        replace(SCENARIO, compile_model=False),
    ):
        assert GUARD not in [g.id for g in choose_guards(other, at)]
    (rule,) = [r for r in GUARDS.values() if r.id == GUARD]
    assert rule.works_around == "F19" and "F19" in rule.reason(at)


def test_only_ddp_and_fsdp2_models_are_compiled() -> None:
    with pytest.raises(ValueError, match="compile_model"):
        Scenario(engine="deepspeed", compile_model=True)


@dataclass
class StandInContext:
    device_type: str
    mode: str
    facts: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)


def stand_in(device_type: str, mode: str) -> Any:
    return StandInContext(device_type, mode)


def test_a_cpu_rank_is_infra_with_the_reason_and_never_trains(monkeypatch: pytest.MonkeyPatch) -> None:
    import repros.trainer.fixed_trainer as fixed_trainer

    monkeypatch.setattr(fixed_trainer, "train", lambda *a: pytest.fail("trained on a CPU"))
    for mode in ("bug", "fixed"):
        with pytest.raises(ScenarioUnavailable, match="needs CUDA") as raised:
            f19.run(stand_in("cpu", mode))
        assert str(raised.value) == CPU_REASON


@pytest.mark.parametrize(("mode", "dropout"), [("bug", 0.1), ("fixed", 0.0)])
def test_a_cuda_rank_trains_the_compiled_scenario_through_the_guards_of_its_mode(
    monkeypatch: pytest.MonkeyPatch, mode: str, dropout: float
) -> None:
    import repros.trainer.fixed_trainer as fixed_trainer
    from repros.trainer.guards import apply_guards

    trained: list[Scenario] = []
    monkeypatch.setattr(
        fixed_trainer, "train", lambda scenario, ctx, guards: trained.append(apply_guards(scenario, guards))
    )
    f19.run(stand_in("cuda", mode))
    (effective,) = trained
    assert effective.compile_model and effective.gradient_checkpointing and effective.engine == "ddp"
    assert effective.lora_dropout == dropout
