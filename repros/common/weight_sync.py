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

Targets, behind one small interface (``SyncTarget``):
- ``TransformersTarget``: a fresh transformers model with the tiny Qwen2 config of
  ``tiny_models`` (another seed, so anything the sync does not overwrite shows), loaded by
  parameter name with the strictness of vLLM's ``load_weights``: an unknown name raises
  ``KeyError`` exactly as ``params_dict[name]`` does, a shape mismatch raises vLLM's
  ``default_weight_loader`` assertion, and ``finish`` raises, listing them, when some target
  parameter was never loaded. This is the target on CPU and wherever vLLM is absent.
- ``VLLMTarget``: the real engine, ``vllm.LLM`` on a saved tiny model directory, weights loaded
  through the worker's ``model_runner.model.load_weights``. Used when vLLM imports and a GPU
  is present. It has NOT been run here (no GPU, no vLLM on this machine): it is written from
  vLLM's public API and kept small on purpose.

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
import tempfile
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from repros.common.tiny_models import VOCAB_SIZE, tiny_qwen2

#: Max abs difference of logits (or log-probabilities) between the trained model and the
#: target that still counts as the same model: bf16 has 8 mantissa bits, and merging
#: ``W + s*B@A`` into one bf16 matrix rounds differently from computing ``Wx + s*B(Ax)``.
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

    def begin(self) -> None:
        """Start a sync: forget which parameters were loaded."""

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> set[str]:
        """Load ``(name, tensor)`` pairs by name; raise as the engine's loader does."""

    def finish(self) -> set[str]:
        """End a sync; raise ``WeightsNotLoaded`` listing parameters never loaded."""

    def scores(self, input_ids: Any) -> Any:
        """Float32 CPU scores of the target on ``input_ids`` [B, T]."""


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
        self.model = tiny_qwen2(seed=seed).to(device=device, dtype=dtype or torch.bfloat16).eval()
        self._params = dict(self.model.named_parameters())
        self._loaded: set[str] = set()

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
            return self.model(input_ids=input_ids.to(self.device)).logits.float().cpu()


def _vllm_load_weights_from_file(worker: Any, path: str) -> list[str]:
    """Runs inside vLLM's worker (``collective_rpc``): what OpenRLHF's ``update_weight`` does."""
    import torch

    weights = torch.load(path, map_location="cpu")
    model = worker.model_runner.model
    loaded = model.load_weights(weights=[(n, t.to(next(model.parameters()).device)) for n, t in weights])
    return sorted(loaded) if loaded is not None else [n for n, _ in weights]


class VLLMTarget:
    """The real engine. NOT run here: no GPU and no vLLM on the machine this was written on.

    vLLM names and packs parameters its own way (``qkv_proj``, ``gate_up_proj``) and its
    ``load_weights`` maps HF names onto them, so completeness is judged on HF names: every
    parameter of the HF model must have been sent and accepted.
    """

    kind = "vllm"
    score_kind = "logprobs"

    def __init__(self, device: Any, seed: int = TARGET_SEED) -> None:
        from vllm import LLM

        self._dir = tempfile.mkdtemp(prefix="f4-vllm-target-")
        base = tiny_qwen2(seed=seed)
        base.save_pretrained(self._dir)
        self._expected = {n for n, _ in base.named_parameters()}
        self.llm = LLM(
            model=self._dir,
            skip_tokenizer_init=True,
            dtype="bfloat16",
            enforce_eager=True,
            gpu_memory_utilization=0.2,
            max_model_len=64,
            max_logprobs=VOCAB_SIZE,
            seed=0,
        )
        self._loaded: set[str] = set()

    def begin(self) -> None:
        self._loaded = set()

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> set[str]:
        import torch

        pairs = [(n, t.detach().cpu()) for n, t in weights]
        with tempfile.NamedTemporaryFile(suffix=".pt", dir=self._dir, delete=False) as fh:
            path = fh.name
        try:
            torch.save(pairs, path)
            self.llm.collective_rpc(_vllm_load_weights_from_file, args=(path,))
        finally:
            os.unlink(path)
        names = {n for n, _ in pairs}
        self._loaded |= names
        return names

    def finish(self) -> set[str]:
        missing = sorted(self._expected - self._loaded)
        if missing:
            raise WeightsNotLoaded(f"Following weights were not initialized from checkpoint: {missing}")
        return set(self._loaded)

    def scores(self, input_ids: Any) -> Any:
        import torch
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=VOCAB_SIZE, detokenize=False)
        prompts = [{"prompt_token_ids": row.tolist()} for row in input_ids.cpu()]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        rows = []
        for out in outputs:
            positions = out.prompt_logprobs[1:]  # position 0 has none
            table = torch.full((len(positions), VOCAB_SIZE), float("nan"))
            for i, entry in enumerate(positions):
                for token, logprob in entry.items():
                    table[i, token] = logprob.logprob
            rows.append(table)
        return torch.stack(rows)


def vllm_usable() -> bool:
    import importlib.util

    import torch

    return importlib.util.find_spec("vllm") is not None and torch.cuda.is_available()


def make_target(device: Any) -> SyncTarget:
    """The real vLLM engine where it can run, else the strict transformers target."""
    if vllm_usable():
        return VLLMTarget(device)
    return TransformersTarget(device)


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
        logits = wrapped(input_ids=batch).logits
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
            if target is not None:
                facts["last_param"] = name
                target.load_weights([(name, param.data)])
                facts["params_sent"] += 1
    if target is not None:
        target.finish()


def gather_full(model: Any, is_sender: bool) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """Every parameter of ``model`` gathered (a collective under ZeRO-3: all ranks call it).
    The sender gets two CPU copies by name: ``raw`` as trained (dtype and, for 4-bit, packing
    kept) and ``full`` in float32 with 4-bit weights dequantized; other ranks get ``None``."""
    named = list(model.named_parameters())
    with gathered([p for _, p in named]):
        if not is_sender:
            return None
        raw = {n: p.detach().cpu().clone() for n, p in named}
        scales = _int8_scales(model)
        full = {n: _full_precision(p, scales) for n, p in named}
    return raw, full


def merge_copy(model: Any, full: dict[str, Any], base_factory: Callable[[], Any] = tiny_qwen2) -> dict[str, Any]:
    """The trained PEFT model merged into plain HF weights, on a copy (the live model is left
    as it is; no collectives). The copy is a fresh unquantized model from ``base_factory`` with
    the same PEFT config, filled by name with the gathered float32 weights (4-bit ones already
    dequantized: merging into a 4-bit base would re-quantize the merged weights), then PEFT's
    ``merge_and_unload``."""
    import torch
    from peft import get_peft_model

    adapter = getattr(model, "active_adapter", "default")
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


def check_scores(target: SyncTarget, batch: Any, reference: Any, tolerance: float) -> float:
    """Max abs diff of the target's scores on ``batch`` against the trained model's;
    ``LogitMismatch`` when over ``tolerance``."""
    expected = to_score_kind(reference, target.score_kind)
    diff = max_abs_diff(target.scores(batch), expected)
    if not diff <= tolerance:
        raise LogitMismatch(
            f"synced {target.kind} target's {target.score_kind} differ from the trained model's by {diff:.4g} "
            f"(tolerance {tolerance}): the weights that reached the engine are not the trained ones"
        )
    return diff


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
    base = tiny_qwen2().to(dtype=torch.bfloat16).eval()
    with torch.no_grad():
        base_logits = base(input_ids=trained.batch.cpu()).logits.float()
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
