"""F33: its signatures on the recorded refusal (a harness run of F33's bug mode in cell ``phi3``, torch 2.13.0 CPU,
transformers 5.23.0, peft 0.21.2, 2 ranks, gloo, 2026-11-27: ``peft.utils.error.NoMatchingPeftModuleError``;
peft 0.15.0 raised a plain ``ValueError`` of the same words), its silent form, its near-misses, what ``explain``
offers instead, and where it can run."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from harness.analysis.explain.logs import logged_errors
from harness.analysis.explain.match import DOCUMENTED, explain, guard_lines
from harness.analysis.explain.report import run_explain
from harness.config.matrix import load_matrix
from harness.config.repros import discover
from harness.execution.classify import DIFFERENT_ERROR, REPRODUCED, classify
from repros.catalog.f33_phi3_llama_target_names import SPEC as F33
from repros.runtime.families import FAMILIES
from repros.runtime.spec import MODES
from tests.support.paths import REPO_ROOT
from tests.support.rank_records import error_record, failed_launch

RECORDED = Path(__file__).resolve().parent.parent / "support" / "recorded"
TEXT = (RECORDED / "f33_target_modules_not_found_phi3_peft-0.21.2_transformers-5.23.0.txt").read_text().strip()
REPROS = list(discover().repros.values())


def observed(exception: str, message: str) -> tuple[str, str | None]:
    launch = failed_launch({r: error_record(r, exception, message) for r in (0, 1)}, {0: 1, 1: 1})
    obs = classify("bug", F33, launch)
    return obs.outcome, obs.signature


@pytest.mark.parametrize("exception", ["peft.utils.error.NoMatchingPeftModuleError", "ValueError"])
def test_peft_refusing_llamas_names_is_f33_in_either_peft(exception: str) -> None:
    assert observed(exception, TEXT) == (REPRODUCED, "F33.target-modules-not-found")


def test_a_name_no_family_fuses_is_another_configuration_error() -> None:
    assert observed("ValueError", "Target modules {'W_packed'} not found in the base model.")[0] == DIFFERENT_ERROR


def test_the_silent_form_is_f33_where_the_named_family_fuses_the_names() -> None:
    def silent(family: str, names: str) -> tuple[str, str | None]:
        message = f"LoRA target modules {names} match no module of the {family} model (X); its linear layers: []"
        error = error_record(0, "repros.trainer.silent_failures.TargetModulesMatchNothing", message)
        obs = classify("scenario", None, failed_launch({0: error}, {0: 1}), [F33])
        return obs.outcome, obs.signature

    assert silent("phi3", "['q_proj', 'v_proj']") == (REPRODUCED, "F33.silent-partial-targets")
    assert silent("qwen2", "['q_prj']")[0] != REPRODUCED  # a typo in a family that keeps Llama's names


def test_explain_names_it_and_offers_the_familys_own_names(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text(
        'Traceback (most recent call last):\n  File "train.py", line 12, in <module>\n'
        f"    model = get_peft_model(model, config)\npeft.utils.error.NoMatchingPeftModuleError: {TEXT}\n"
    )
    found = explain(logged_errors(log.read_text()), REPROS)
    assert [(m.repro.id, m.signature.id, m.status) for m in found.matches] == [
        ("F33", "F33.target-modules-not-found", DOCUMENTED)
    ]
    console = Console(width=400)
    assert run_explain(str(log), None, False, None, tmp_path, None, [], console) == 0
    out = capsys.readouterr().out
    assert "F33: LoRA on a Phi-3 by Llama's q_proj/v_proj" in out
    assert "what to write instead: in Phi3ForCausalLM (phi3) write target_modules=['qkv_proj']" in out
    assert "every projection: ['qkv_proj', 'o_proj', 'gate_up_proj', 'down_proj']" in out
    assert "family-target-modules" in out  # the fixed trainer's guard


def test_the_guard_that_resolves_the_names_works_around_f33_and_f23() -> None:
    assert any("family-target-modules" in line for line in guard_lines("F33", None))
    assert any("family-target-modules" in line for line in guard_lines("F23", None))


def test_it_runs_in_the_families_that_fuse_projections_only() -> None:
    assert {f for f in FAMILIES if f not in F33.impossible_in} == {"phi3"}
    assert F33.depends_on == ("peft", "transformers")


def test_the_grid_reports_every_combination_in_a_phi3_by_f33s_name() -> None:
    matrix = load_matrix(REPO_ROOT / "matrix.yaml", known_repros=discover().repros.keys(), known_modes=MODES)
    assert matrix.grid is not None and "phi3" in {c.family for c in matrix.cells.values()}
    versions = {"torch": "2.13.0", "peft": "0.21.2", "transformers": "5.23.0"}
    for combination in ({"adapter": "lora", "engine": "ddp"}, {"adapter": "dschat-lora", "engine": "deepspeed-zero2"}):
        rule = matrix.grid.expectation(combination, versions, "cpu", family="phi3")
        assert rule is not None and rule.outcome == REPRODUCED
        assert rule.names("F33.target-modules-not-found") and rule.names("F33.silent-partial-targets")
