"""F15: its signature on the recorded failure texts and its near-misses; the check that raises it; the
guard that works around it; and a grid combination that meets it named by it.

Recorded texts (tests/support/recorded/), each the failing rank's message in a harness run (torch 2.13.0
CPU, 2 ranks, gloo, F15's bug mode):
- ``f15_loss_not_finite_transformers-5.5.4_...``: cell ``tf-5.5``; rank 1's placeholders held 59 NaN.
- ``f15_loss_not_finite_transformers-4.57.6_...``: cell ``tf4``; rank 1's placeholders held 4 NaN.
- ``f15_loss_not_finite_rank_log_...log``: rank 1's log in cell ``tf-5.5``, progress bar and traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from harness.analysis.explain.logs import logged_errors
from harness.analysis.explain.match import DOCUMENTED, explain
from harness.config.expectations import expectation_for
from harness.config.repros import discover
from harness.execution.classify import DIFFERENT_ERROR, REPRODUCED, classify
from harness.execution.launchers.result import LaunchResult
from repros.catalog.f15_fsdp_ram_efficient_loading_nan import SCENARIO, raise_if_loss_not_finite
from repros.catalog.f15_fsdp_ram_efficient_loading_nan import SPEC as F15
from repros.runtime.outcomes import Outcome
from repros.trainer.guards import apply_guards, choose_guards
from repros.trainer.scenario import Scenario
from repros.trainer.silent_failures import LossNotFinite
from tests.support.rank_records import error_record, failed_launch

RECORDED = Path(__file__).resolve().parent.parent / "support" / "recorded"
REPROS = list(discover().repros.values())
KNOWN = [r.spec for r in REPROS]
NOT_FINITE = f"{LossNotFinite.__module__}.{LossNotFinite.__qualname__}"
TEXTS = [
    "f15_loss_not_finite_transformers-5.5.4_torch-2.13.0.txt",
    "f15_loss_not_finite_transformers-4.57.6_torch-2.13.0.txt",
]
#: Installed versions as the cells of the matrix have them.
TF55 = {"transformers": Version("5.5.4"), "torch": Version("2.13.0"), "accelerate": Version("1.15.0")}
CURRENT = {**TF55, "transformers": Version("5.23.0")}

#: What a rank records about what it loaded (``repros/trainer/fsdp_loading.py``'s ``placeholder_facts``).
LOADED = {"tensors_equal_to_checkpoint": 27, "tensors_differing": 0, "nan_elements": 0, "inf_elements": 0}
GARBAGE = {"tensors_equal_to_checkpoint": 0, "tensors_differing": 27, "nan_elements": 59, "inf_elements": 0}


def recorded(name: str) -> str:
    return (RECORDED / name).read_text()


def failing_launch(etype: str, message: str) -> LaunchResult:
    return failed_launch({1: error_record(1, etype, message)}, exitcodes={1: 1})


def observed(spec: Any, etype: str, message: str) -> tuple[str, str | None]:
    obs = classify("bug", spec, failing_launch(etype, message))
    return obs.outcome, obs.signature


@pytest.mark.parametrize("name", TEXTS)
def test_f15_recorded_texts_are_f15(name: str) -> None:
    text = recorded(name)
    assert "rank 1: 0 of 27 tensors equal to the checkpoint" in text
    assert observed(F15, NOT_FINITE, text) == (REPRODUCED, "F15.loss-nan")


@pytest.mark.parametrize("name", TEXTS)
def test_f15_a_traceback_of_it_is_explained_as_f15(name: str) -> None:
    log = f'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n{NOT_FINITE}: {recorded(name)}'
    (match,) = explain(logged_errors(log), REPROS).matches
    assert (match.repro.id, match.signature.id, match.status) == ("F15", "F15.loss-nan", DOCUMENTED)


def test_f15_the_rank_log_is_explained_as_f15_from_its_traceback() -> None:
    errors = logged_errors(recorded("f15_loss_not_finite_rank_log_transformers-5.5.4_torch-2.13.0.log"))
    assert [e.type for e in errors] == [NOT_FINITE]
    (match,) = explain(errors, REPROS).matches
    assert (match.repro.id, match.signature.id, match.status) == ("F15", "F15.loss-nan", DOCUMENTED)


@pytest.mark.parametrize(
    ("etype", "message"),
    [
        # Another silent failure of the fixed trainer's checks: not F15.
        ("repros.trainer.silent_failures.ReloadedAdapterDiffers", "reloaded adapter differs from the trained one"),
        # torch's own NaN check (anomaly mode) names no loading.
        ("RuntimeError", "Function 'MmBackward0' returned nan values in its 0th output."),
    ],
)
def test_f15_near_misses(etype: str, message: str) -> None:
    assert observed(F15, etype, message)[0] == DIFFERENT_ERROR


def test_a_finite_loss_raises_nothing_and_a_nan_one_names_what_each_rank_loaded() -> None:
    raise_if_loss_not_finite({"losses": [2.1, 2.0, 1.9]}, [LOADED, GARBAGE])
    with pytest.raises(LossNotFinite) as raised:
        # Non-finite figures travel through the rank's record as their names.
        raise_if_loss_not_finite({"losses": [2.1, "nan", "nan"]}, [LOADED, GARBAGE])
    message = str(raised.value)
    assert message.startswith("loss is not finite from step 2 (2 of 3 steps, first nan)")
    assert "rank 0: 27 of 27 tensors equal" in message and "rank 1: 0 of 27 tensors equal" in message
    assert "59 NaN" in message
    with pytest.raises(LossNotFinite, match="from step 1"):
        raise_if_loss_not_finite({"losses": [float("inf")]}, [None, GARBAGE])


def test_f15_guard_broadcasts_rank0s_weights_under_ram_efficient_loading_only() -> None:
    assert SCENARIO.engine == "fsdp2" and SCENARIO.fsdp_cpu_ram_efficient_loading
    for versions in (TF55, CURRENT):  # the broadcast is what accelerate does, on every release
        guards = choose_guards(SCENARIO, versions)
        assert "fsdp2-broadcast-rank0-weights" in [g.id for g in guards]
        assert apply_guards(SCENARIO, guards).fsdp2_broadcast_from_rank0
    every_rank_loads = Scenario(engine="fsdp2", bf16=False, gradient_checkpointing=False)
    assert "fsdp2-broadcast-rank0-weights" not in [g.id for g in choose_guards(every_rank_loads, TF55)]


def test_f15_expectations_follow_the_bisected_boundaries() -> None:
    def expected(transformers: str) -> str | None:
        found = expectation_for(F15, "bug", {"transformers": transformers})
        return found.outcome if found else None

    assert [expected(v) for v in ("4.57.6", "5.3.0", "5.4.0", "5.5.4", "5.6.0", "5.23.0")] == [
        Outcome.REPRODUCED,
        Outcome.NOT_REPRODUCED,
        Outcome.REPRODUCED,
        Outcome.REPRODUCED,
        Outcome.NOT_REPRODUCED,
        Outcome.NOT_REPRODUCED,
    ]


def test_a_grid_combination_meeting_f15_is_named_by_it() -> None:
    message = recorded(TEXTS[0])
    obs = classify("scenario", None, failing_launch(NOT_FINITE, message), KNOWN)
    assert (obs.outcome, obs.signature) == (Outcome.REPRODUCED, "F15.loss-nan")


def test_nan_placeholders_on_a_rank_but_0_are_f15_even_when_the_loss_stays_finite() -> None:
    """The garbage is uninitialized memory: whether it reaches the loss varies from run to run (a CI run of
    tf4 loaded 5 NaN on rank 1 and trained a finite loss). What rank 1 loaded is the failure either way."""
    from repros.catalog.f15_fsdp_ram_efficient_loading_nan import raise_if_placeholders_not_finite
    from repros.trainer.silent_failures import LoadedNotFinite

    clean = {"nan_elements": 0, "inf_elements": 0, "tensors_differing": 0}
    garbage = {"nan_elements": 5, "inf_elements": 0, "tensors_differing": 27, "first_nonfinite": "model.x.weight"}
    raise_if_placeholders_not_finite([clean, clean])
    raise_if_placeholders_not_finite([garbage, clean])  # rank 0 reads the checkpoint: never a placeholder
    raise_if_placeholders_not_finite([clean, {**clean, "zeroed_elements": 100}])  # zeros (transformers >= 5.6)
    with pytest.raises(LoadedNotFinite) as raised:
        raise_if_placeholders_not_finite([clean, garbage])
    etype = f"{LoadedNotFinite.__module__}.{LoadedNotFinite.__qualname__}"
    assert observed(F15, etype, str(raised.value)) == (REPRODUCED, "F15.nan-placeholders")
