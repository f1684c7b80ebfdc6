"""The fixed trainer picks its guards from the scenario and the installed versions."""

from __future__ import annotations

import pytest
from packaging.version import Version

from repros.common import fixed_trainer
from repros.common.fixed_trainer import Scenario, apply_guards, choose_guards

F1_SCENARIO = Scenario(zero_stage=3, gradient_checkpointing=True, use_reentrant=False)


def with_deepspeed(monkeypatch: pytest.MonkeyPatch, version: str | None) -> None:
    monkeypatch.setattr(fixed_trainer, "_version", lambda package: Version(version) if version else None)


def ids(guards: list[fixed_trainer.Guard]) -> list[str]:
    return [g.id for g in guards]


def test_affected_deepspeed_gets_reentrant_checkpointing_with_input_grads(monkeypatch: pytest.MonkeyPatch) -> None:
    with_deepspeed(monkeypatch, "0.19.2")
    guards = choose_guards(F1_SCENARIO)
    assert ids(guards) == ["use-cache-off", "zero3-reentrant-checkpointing", "input-require-grads"]
    effective = apply_guards(F1_SCENARIO, guards)
    assert effective.use_reentrant and effective.input_require_grads and effective.use_cache is False


def test_fixed_deepspeed_keeps_the_users_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    with_deepspeed(monkeypatch, "0.19.3")
    guards = choose_guards(F1_SCENARIO)
    assert ids(guards) == ["use-cache-off"]
    assert apply_guards(F1_SCENARIO, guards).use_reentrant is False


def test_zero2_needs_no_f1_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    with_deepspeed(monkeypatch, "0.19.2")
    assert "zero3-reentrant-checkpointing" not in ids(choose_guards(Scenario(zero_stage=2)))


def test_reentrant_checkpointing_always_gets_input_grads(monkeypatch: pytest.MonkeyPatch) -> None:
    with_deepspeed(monkeypatch, "0.19.8")
    assert "input-require-grads" in ids(choose_guards(Scenario(use_reentrant=True)))
