"""F23: its signature on the recorded failure text (a harness run of F23's bug mode in cell ``llava``,
torch 2.13.0 CPU, transformers 5.23.0, peft 0.21.2, 2 ranks, gloo, 2026-11-26: the adapters of the CLIP
tower's last layer, parameter indices 4-7, got no gradient on either rank), its near-misses, and where it
can run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.analysis.explain.logs import logged_errors
from harness.analysis.explain.match import PROBABLE, explain
from harness.config.repros import discover
from harness.execution.classify import DIFFERENT_ERROR, REPRODUCED, classify
from repros.catalog.f23_vlm_lora_unused_vision_layer_ddp import SPEC as F23
from repros.runtime.families import FAMILIES
from tests.support.rank_records import error_record, failed_launch

RECORDED = Path(__file__).resolve().parent.parent / "support" / "recorded"
TEXT = (RECORDED / "f23_unused_vision_adapters_ddp_transformers-5.23.0_peft-0.21.2.txt").read_text()


def observed(message: str, facts: dict[str, Any] | None) -> tuple[str, str | None]:
    launch = failed_launch({r: error_record(r, "RuntimeError", message, facts=facts) for r in (0, 1)}, {0: 1, 1: 1})
    obs = classify("bug", F23, launch)
    return obs.outcome, obs.signature


def test_the_recorded_text_names_the_unused_parameters_and_is_f23_in_a_vlm_run() -> None:
    assert "did not receive grad for rank 0: 4 5 6 7" in TEXT
    assert observed(TEXT, {"engine": "ddp", "family": "llava"}) == (REPRODUCED, "F23.unused-vision-adapters")


@pytest.mark.parametrize("facts", [{"engine": "ddp", "family": "qwen2"}, {"engine": "ddp"}, None])
def test_the_same_words_from_a_text_model_are_another_unused_parameter(facts: dict[str, Any] | None) -> None:
    assert observed(TEXT, facts)[0] == DIFFERENT_ERROR


def test_explain_calls_a_log_of_it_probable_and_says_it_needs_the_family() -> None:
    log = f'Traceback (most recent call last):\n  File "train.py", line 9, in <module>\nRuntimeError: {TEXT}\n'
    found = [m for m in explain(logged_errors(log), list(discover().repros.values())).matches if m.repro.id == "F23"]
    assert [(m.signature.id, m.status) for m in found] == [("F23.unused-vision-adapters", PROBABLE)]


def test_it_runs_in_the_vision_families_only() -> None:
    assert {f for f in FAMILIES if f not in F23.impossible_in} == {f.name for f in FAMILIES.values() if f.vision}


#: The grid's DeepSpeed and FSDP2 combinations in a LLaVA (``grid --cells current --only family=llava``,
#: 2026-11-26): nothing raised, the last CLIP layer's adapters got no gradient, the scenario item named it.
SILENT = (
    "vision adapters got no gradient: 4 of 16 adapter parameters are in the vision tower and got no gradient at "
    "any step (e.g. base_model.model.model.vision_tower.encoder.layers.1.self_attn.q_proj.lora_A.default.weight)"
)


def test_the_silent_form_under_deepspeed_or_fsdp2_is_f23_in_a_vlm_run_only() -> None:
    def silent(facts: dict[str, Any]) -> tuple[str, str | None]:
        etype = "repros.trainer.silent_failures.VisionAdaptersGotNoGradient"
        launch = failed_launch({r: error_record(r, etype, SILENT, facts=facts) for r in (0, 1)}, {0: 1, 1: 1})
        obs = classify("bug", F23, launch)
        return obs.outcome, obs.signature

    assert silent({"engine": "deepspeed", "family": "llava"}) == (REPRODUCED, "F23.silent-vision-adapters")
    assert silent({"engine": "fsdp2", "family": "qwen2"})[0] == DIFFERENT_ERROR
