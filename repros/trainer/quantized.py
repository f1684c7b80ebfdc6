"""The test model of ``tiny_models`` (the item's family) quantized by bitsandbytes, loaded the way users load one.

The random-weight model is saved to a temporary directory and loaded back with
``from_pretrained(..., quantization_config=BitsAndBytesConfig(...))``: transformers' own
quantizer replaces the linear layers (``Linear4bit`` for ``nf4``, ``Linear8bitLt`` for
``int8``) and marks the model as a bitsandbytes model, exactly as for a hub checkpoint.
Nothing is loaded from a hub. Device placement is left to transformers' defaults (on a
GPU rank it places the model on the current device, which the rank has set).

Where the installed libraries cannot quantize on this device at all (bitsandbytes releases
before CPU support: "Device type not supported for FP4 quantization: cpu"; transformers
releases whose bitsandbytes quantizer requires CUDA: "No GPU found. A GPU is needed for
quantization."), ``ScenarioUnavailable`` carries the library's own message: such a cell is
``INFRA``, never a reproduction.

``no_repack`` is the fixed trainer's ``bnb-cpu-no-repack`` guard: bitsandbytes on an
AVX512-BF16 CPU repacks a ``Linear4bit`` weight in place on its first eval-mode forward
(``support_avx512bf16_for_cpu``), after which dequantize / merge return wrong weights.
The guard sets that flag to ``False`` on every ``Linear4bit`` that has it. What the load
did (the layers touched, whether the attribute exists) is kept in ``last_load_facts()``.

Heavy imports stay inside functions.
"""

from __future__ import annotations

import os
import re
import tempfile
from importlib import metadata
from typing import Any

from repros.runtime.record import ScenarioUnavailable

QUANTIZATIONS = ("nf4", "int8")

#: Messages with which the libraries say they cannot quantize on this device at all.
#: Only these become ``ScenarioUnavailable``; anything else propagates as it is.
_DEVICE_UNSUPPORTED = (
    re.compile(r"Device type not supported for FP4 quantization"),  # bitsandbytes < 0.46 (4-bit) on CPU
    re.compile(r"No GPU found\. A GPU is needed for quantization"),  # transformers whose bnb quantizer needs CUDA
    re.compile(r"requires the latest version of bitsandbytes"),  # transformers: bnb not usable on this device
    re.compile(r"bitsandbytes.*(?:compiled without GPU support|no CUDA|CUDA Setup failed)", re.IGNORECASE),
    re.compile(r"Device type not supported for .*: cpu"),
    # transformers 4.4x-4.5x: bitsandbytes without its multi-backend (CPU) support
    re.compile(r"CUDA is required but not available for bitsandbytes"),
    # transformers 5.x: no available device is one the installed bitsandbytes supports
    re.compile(r"None of the available devices .* are supported by the bitsandbytes version you have installed"),
)

_LAST_LOAD: dict[str, Any] = {}


def last_load_facts() -> dict[str, Any]:
    """What the latest ``load_quantized_tiny_qwen2`` call did (empty before the first)."""
    return dict(_LAST_LOAD)


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _unavailable_reason(exc: BaseException) -> str | None:
    text = f"{exc}"
    if any(p.search(text) for p in _DEVICE_UNSUPPORTED):
        return f"{type(exc).__name__}: {text}"
    return None


def _bnb_config(quantization: str, quant_storage: str | None = None) -> Any:
    import torch
    from transformers import BitsAndBytesConfig

    if quantization == "nf4":
        storage = {"bnb_4bit_quant_storage": getattr(torch, quant_storage)} if quant_storage else {}
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=torch.bfloat16,
            bnb_4bit_use_double_quant=False,
            **storage,
        )
    return BitsAndBytesConfig(load_in_8bit=True)


def _dtype_kwarg() -> str:
    """transformers renamed ``torch_dtype`` to ``dtype`` in 4.56; older releases know only the former."""
    from packaging.version import Version

    version = _version("transformers")
    return "dtype" if version is not None and Version(version) >= Version("4.56.0") else "torch_dtype"


def disable_cpu_repack(model: Any) -> tuple[int, int]:
    """Set ``support_avx512bf16_for_cpu = False`` on every ``Linear4bit``; returns
    (layers touched, ``Linear4bit`` layers seen)."""
    import bitsandbytes as bnb

    seen = touched = 0
    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            seen += 1
            if hasattr(module, "support_avx512bf16_for_cpu"):
                module.support_avx512bf16_for_cpu = False
                touched += 1
    return touched, seen


def _untied_state(model: Any) -> dict[str, Any]:
    """``model``'s state dict with each shared tensor once (the first name: a tied model's
    ``embed_tokens``, not its ``lm_head``), as ``save_pretrained`` writes it: safetensors refuses
    tensors that share memory, and ``from_pretrained`` ties them again from the config."""
    state: dict[str, Any] = {}
    seen: set[tuple[int, tuple[int, ...]]] = set()
    for name, tensor in model.state_dict().items():
        key = (tensor.data_ptr(), tuple(tensor.shape))
        if key in seen:
            continue
        seen.add(key)
        state[name] = tensor.contiguous()
    return state


def load_quantized_tiny_qwen2(quantization: str, no_repack: bool = False, quant_storage: str | None = None) -> Any:
    """The test model of the item's family (random weights) quantized by bitsandbytes: ``nf4`` or ``int8``; a
    4-bit model's packed weights stored as ``quant_storage`` (a torch dtype's name; ``None``: bitsandbytes'
    ``uint8``)."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {quantization!r}; known: {QUANTIZATIONS}")
    _LAST_LOAD.clear()
    _LAST_LOAD.update(quantization=quantization, bitsandbytes=_version("bitsandbytes"), quant_storage=quant_storage)

    import torch

    from repros.trainer.tiny_models import load_pretrained, tiny_qwen2

    try:
        import bitsandbytes  # noqa: F401 - a release that cannot load here says so on import
    except Exception as exc:  # noqa: BLE001 - old releases raise RuntimeError/OSError without CUDA
        reason = _unavailable_reason(exc)
        if reason is not None:
            raise ScenarioUnavailable(f"bitsandbytes cannot load on this device: {reason}") from exc
        raise

    base = tiny_qwen2()
    with tempfile.TemporaryDirectory(prefix="ft-regress-tiny-qwen2-") as directory:
        # Written by hand rather than ``save_pretrained``: under torch.distributed,
        # transformers 5 writes checkpoint files on rank 0 only, and every rank loads its own.
        from safetensors.torch import save_file

        base.config.save_pretrained(directory)
        state = _untied_state(base)
        save_file(state, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
        del base, state
        try:
            model = load_pretrained(
                directory,
                quantization_config=_bnb_config(quantization, quant_storage),
                **{_dtype_kwarg(): torch.bfloat16},
            )
        except (RuntimeError, NotImplementedError, ImportError, ValueError, OSError) as exc:
            reason = _unavailable_reason(exc)
            if reason is not None:
                raise ScenarioUnavailable(f"bitsandbytes {quantization} on this device: {reason}") from exc
            raise

    _LAST_LOAD["layer_type"] = sorted(
        {type(m).__name__ for m in model.modules() if type(m).__module__.startswith("bitsandbytes")}
    )
    if no_repack:
        touched, seen = disable_cpu_repack(model)
        _LAST_LOAD.update(no_repack_layers_touched=touched, linear4bit_layers=seen)
    return model
