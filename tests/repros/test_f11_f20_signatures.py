"""F11 and F20 signatures on recorded failure texts, with their near-misses; the guards that work
around them; and a grid combination that meets them named by them.

Recorded texts (tests/support/recorded/), each from a harness run (torch 2.13.0 CPU, 2 ranks, gloo):
- ``f11_strict_zip_...txt``: F11's bug mode in cell ``tf4`` (the failing rank's message);
  ``f11_strict_zip_rank_log_...log``: the same rank's log, traceback and all;
  ``f11_strict_zip_upstream_transformers-43692.log``: rank 0's traceback as transformers PR #43692
  prints it (torchrun's ``[rankN]:`` prefixes, torch 2.10 on CUDA/NCCL, ZeRO-3).
- ``f20_silent_disagreement_...txt``: F20's bug mode with accelerate 1.7.0 (cell ``tf4-accelerate-1.7.0``):
  the engine stepped the optimizer twice per Trainer step, its gradient accumulation 1 where the
  ``TrainingArguments`` asked for 2.
- ``f20_mismatch_error_upstream_trlx-376.txt``: the loud form as CarperAI/trlx#376 prints it (an
  explicit value that differs from the ``TrainingArguments``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from harness.analysis.explain.logs import logged_errors
from harness.analysis.explain.match import DOCUMENTED, explain
from harness.config.repros import discover
from harness.execution.classify import DIFFERENT_ERROR, REPRODUCED, classify
from harness.execution.launchers.result import LaunchResult
from repros.catalog.f11_trainer_scheduler_param_groups import SPEC as F11
from repros.catalog.f11_trainer_scheduler_param_groups import TRANSFORMERS_SCHEDULER_AFTER_PREPARE
from repros.catalog.f20_deepspeed_config_disagrees import SPEC as F20
from repros.catalog.f20_deepspeed_config_disagrees import disagreements
from repros.runtime.outcomes import Outcome
from repros.trainer.guards import apply_guards, choose_guards
from repros.trainer.hf_trainer import trainer_deepspeed_config
from repros.trainer.scenario import Scenario
from repros.trainer.silent_failures import DeepSpeedConfigDisagrees
from tests.support.rank_records import error_record, failed_launch

RECORDED = Path(__file__).resolve().parent.parent / "support" / "recorded"
REPROS = list(discover().repros.values())
KNOWN = [r.spec for r in REPROS]


def recorded(name: str) -> str:
    return (RECORDED / name).read_text()


F11_TEXT = recorded("f11_strict_zip_torch-2.13.0_transformers-4.57.6.txt")
F11_LOG = recorded("f11_strict_zip_rank_log_torch-2.13.0_transformers-4.57.6.log")
F20_SILENT = recorded("f20_silent_disagreement_accelerate-1.7.0_transformers-4.57.6.txt")
F20_LOUD = recorded("f20_mismatch_error_upstream_trlx-376.txt")
DISAGREES = f"{DeepSpeedConfigDisagrees.__module__}.{DeepSpeedConfigDisagrees.__qualname__}"
#: Installed versions as a cell of the matrix has them.
TF4 = {"transformers": Version("4.57.6"), "deepspeed": Version("0.19.8"), "torch": Version("2.13.0")}
CURRENT = {**TF4, "transformers": Version("5.23.0")}


def failing_launch(etype: str, message: str) -> LaunchResult:
    return failed_launch({0: error_record(0, etype, message)}, exitcodes={0: 1})


def observed(spec: Any, etype: str, message: str) -> tuple[str, str | None]:
    obs = classify("bug", spec, failing_launch(etype, message))
    return obs.outcome, obs.signature


def test_f11_recorded_text_is_f11() -> None:
    assert observed(F11, "ValueError", F11_TEXT) == (REPRODUCED, "F11.strict-zip-param-groups")


def test_f11_the_rank_log_is_explained_as_f11_from_its_traceback() -> None:
    errors = logged_errors(F11_LOG)
    assert [e.type for e in errors] == ["ValueError"]
    (match,) = explain(errors, REPROS).matches
    assert (match.repro.id, match.signature.id, match.status) == ("F11", "F11.strict-zip-param-groups", DOCUMENTED)


def test_f11_the_upstream_cuda_log_is_explained_as_f11() -> None:
    errors = logged_errors(recorded("f11_strict_zip_upstream_transformers-43692.log"))
    assert [e.type for e in errors] == ["ValueError"]
    (match,) = explain(errors, REPROS).matches
    assert (match.repro.id, match.signature.id, match.status) == ("F11", "F11.strict-zip-param-groups", DOCUMENTED)


@pytest.mark.parametrize(
    ("etype", "message"),
    [
        # The other direction of a strict zip: fewer learning rates than groups (a group added later).
        ("ValueError", "zip() argument 2 is shorter than argument 1"),
        ("TypeError", "zip() argument 2 is longer than argument 1"),
    ],
)
def test_f11_near_misses(etype: str, message: str) -> None:
    assert observed(F11, etype, message)[0] == DIFFERENT_ERROR


def test_f11_guard_applies_before_the_fix_only_and_drops_the_empty_groups() -> None:
    bug = Scenario(trainer_loop="hf", zero_stage=2, deepspeed_scheduler=False, gradient_checkpointing=False)
    assert "drop-empty-param-groups" in [g.id for g in choose_guards(bug, TF4)]
    assert "drop-empty-param-groups" not in [g.id for g in choose_guards(bug, CURRENT)]
    assert apply_guards(bug, choose_guards(bug, TF4)).drop_empty_param_groups
    # With DeepSpeed's own scheduler (HF's guide) there is nothing to guard.
    guide = Scenario(trainer_loop="hf", zero_stage=2, gradient_checkpointing=False)
    assert "drop-empty-param-groups" not in [g.id for g in choose_guards(guide, TF4)]
    assert TRANSFORMERS_SCHEDULER_AFTER_PREPARE == Version("5.1.0")


def test_the_deepspeed_config_leaves_out_what_the_scenario_says() -> None:
    guide = trainer_deepspeed_config(Scenario(trainer_loop="hf"))
    assert guide["scheduler"]["params"]["warmup_max_lr"] == "auto"
    assert guide["gradient_accumulation_steps"] == guide["gradient_clipping"] == "auto"
    assert "scheduler" not in trainer_deepspeed_config(Scenario(trainer_loop="hf", deepspeed_scheduler=False))
    omitted = trainer_deepspeed_config(
        Scenario(trainer_loop="hf", ds_config_omits=("gradient_accumulation_steps", "scheduler.params.warmup_max_lr"))
    )
    assert "gradient_accumulation_steps" not in omitted
    assert "warmup_max_lr" not in omitted["scheduler"]["params"]
    with pytest.raises(ValueError, match="ds_config_omits"):
        Scenario(trainer_loop="hf", ds_config_omits=("optimizer.params.lr",))


def test_a_grid_combination_meeting_f11_is_named_by_it() -> None:
    obs = classify("scenario", None, failing_launch("ValueError", F11_TEXT), KNOWN)
    assert (obs.outcome, obs.signature) == (Outcome.REPRODUCED, "F11.strict-zip-param-groups")


def settings(optimizer_steps: int, **used: Any) -> dict[str, Any]:
    asked = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0}
    return {
        "used": {**asked, "gradient_accumulation_steps": 1, "peak_lr": None, **used},
        "asked": {**asked, "peak_lr": 1e-3},
        "optimizer_steps": optimizer_steps,
        "trainer_steps": 5,
    }


def test_f20_an_engine_stepping_per_micro_batch_disagrees_and_a_reported_number_alone_does_not() -> None:
    # accelerate before PR #3630: the engine's own count (1) decides, two optimizer steps per Trainer step.
    (found,) = disagreements(settings(10))
    assert (
        found.startswith("optimizer_steps=10 in 5 Trainer steps") and "gradient_accumulation_steps=1 (asked 2)" in found
    )
    # accelerate from PR #3630 on: the engine still reports 1, but steps at accelerate's boundaries only.
    assert disagreements(settings(5)) == []
    assert disagreements(settings(5, gradient_clipping=0.0)) == ["gradient_clipping=0.0 (asked 1.0)"]
    assert disagreements(settings(5, peak_lr=0.001)) == []


def test_f20_recorded_texts_are_f20() -> None:
    assert observed(F20, DISAGREES, F20_SILENT) == (REPRODUCED, "F20.silent-disagreement")
    assert observed(F20, "ValueError", F20_LOUD) == (REPRODUCED, "F20.mismatch-error")
    assert observed(F20, "ValueError", F20_SILENT)[0] == DIFFERENT_ERROR


def test_f20_the_upstream_mismatch_error_is_explained_as_f20() -> None:
    lines = [
        "Traceback (most recent call last):",
        '  File "/opt/conda/lib/python3.8/site-packages/transformers/deepspeed.py", line 221, in '
        "trainer_config_finalize",
        "    raise ValueError(",
        f"ValueError: {F20_LOUD}",
    ]
    (match,) = explain(logged_errors("\n".join(lines)), REPROS).matches
    assert (match.repro.id, match.signature.id, match.status) == ("F20", "F20.mismatch-error", DOCUMENTED)


def test_f20_guard_writes_every_shared_value_as_auto() -> None:
    bug = Scenario(
        trainer_loop="hf", zero_stage=2, gradient_accumulation_steps=2, ds_config_omits=("gradient_accumulation_steps",)
    )
    guards = choose_guards(bug, TF4)
    assert "ds-config-auto" in [g.id for g in guards]
    fixed = apply_guards(bug, guards)
    assert fixed.ds_config_omits == ()
    assert trainer_deepspeed_config(fixed)["gradient_accumulation_steps"] == "auto"


def test_a_grid_combination_meeting_f20_is_named_by_it() -> None:
    obs = classify("scenario", None, failing_launch(DISAGREES, F20_SILENT), KNOWN)
    assert (obs.outcome, obs.signature) == (Outcome.REPRODUCED, "F20.silent-disagreement")
