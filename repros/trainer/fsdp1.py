"""torch's first FSDP (``FullyShardedDataParallel``) for the fixed trainer: wrapping a PEFT model
as users do, and reading its adapters' full weights and gradients by name.

FSDP1 shards *flat* parameters: each unit concatenates its module's parameters into one. With
``use_orig_params=False`` (its default) the module's ``parameters()`` are those flat parameters
and the original ones exist only as views, so the adapters are read by name: weights under
``summon_full_params``; gradients with ``summon_full_params(with_grads=True)`` where FSDP supports
it (``use_orig_params=True``), else from each flat parameter's local gradient shard, summed over
ranks.
"""

from __future__ import annotations

import functools
import math
from typing import Any

#: What FSDP1 puts into the names of the modules it wraps.
_WRAPPED = "_fsdp_wrapped_module."
#: What a CPU-only torch says when its FSDP1 cannot run without an accelerator at all.
_NO_ACCELERATOR = ("Found no NVIDIA driver", "Torch not compiled with CUDA enabled")


def clean_name(name: str) -> str:
    return name.replace(_WRAPPED, "").replace(_WRAPPED.rstrip("."), "").strip(".")


def auto_wrap_policy(wrap: str, model: Any) -> Any:
    """``layer``: each decoder layer a unit; ``none``: one unit; ``peft``: PEFT's policy."""
    if wrap == "none":
        return None
    if wrap == "peft":
        from peft.utils.other import fsdp_auto_wrap_policy

        return fsdp_auto_wrap_policy(model)
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    from repros.trainer.tiny_models import is_decoder_layer

    layer_classes = {type(m) for m in model.modules() if is_decoder_layer(m)}
    return functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=layer_classes)


def wrap_fsdp1(model: Any, wrap: str, use_orig_params: bool, device: Any) -> Any:
    """``FullyShardedDataParallel(model, ...)`` on ``device``. On a CPU, FSDP1 needs
    ``device_id=torch.device("cpu")`` (torch >= 2.2; without it: "FSDP needs a non-CPU accelerator
    device"); a torch whose FSDP1 cannot run without CUDA gives ``ScenarioUnavailable`` with its
    own words."""
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel

    from repros.runtime.record import ScenarioUnavailable

    try:
        return FullyShardedDataParallel(
            model, auto_wrap_policy=auto_wrap_policy(wrap, model), use_orig_params=use_orig_params, device_id=device
        )
    except (RuntimeError, AssertionError) as exc:
        if device.type == "cpu" and any(marker in str(exc) for marker in _NO_ACCELERATOR):
            raise ScenarioUnavailable(
                f"FSDP1 of torch {torch.__version__} cannot run on a CPU: {type(exc).__name__}: {exc}"
            ) from exc
        raise


def full_params(fsdp: Any, names: list[str]) -> dict[str, Any]:
    """The full (unsharded) value of each named parameter, as float32 copies. A collective."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    wanted = set(names)
    found: dict[str, Any] = {}
    with FullyShardedDataParallel.summon_full_params(fsdp, writeback=False):
        for name, param in fsdp.named_parameters():
            name = clean_name(name)
            if name in wanted:
                found[name] = param.detach().float().clone()
    return {name: found.get(name) for name in names}


def full_grad_norms(fsdp: Any, names: list[str]) -> dict[str, float | None]:
    """The norm of each named parameter's full gradient (None: no rank has a gradient for it).
    A collective: every rank must call it with the same names."""
    if getattr(fsdp, "_use_orig_params", False):
        return _grad_norms_orig_params(fsdp, names)
    return _grad_norms_flat(fsdp, names)


def full_grads(fsdp: Any, names: list[str]) -> dict[str, Any]:
    """The full gradient of each named parameter as a float32 copy (None: it has none). A collective. Only
    with ``use_orig_params=True`` does FSDP give a parameter's own gradient; with flat parameters each is
    None (read the norms instead, ``full_grad_norms``)."""
    if not getattr(fsdp, "_use_orig_params", False):
        return {name: None for name in names}
    from torch.distributed.fsdp import FullyShardedDataParallel

    wanted = set(names)
    found: dict[str, Any] = {}
    with FullyShardedDataParallel.summon_full_params(fsdp, writeback=False, with_grads=True):
        for name, param in fsdp.named_parameters():
            name = clean_name(name)
            if name in wanted:
                found[name] = None if param.grad is None else param.grad.detach().float().clone()
    return {name: found.get(name) for name in names}


def _grad_norms_orig_params(fsdp: Any, names: list[str]) -> dict[str, float | None]:
    from torch.distributed.fsdp import FullyShardedDataParallel

    wanted = set(names)
    found: dict[str, float | None] = {}
    with FullyShardedDataParallel.summon_full_params(fsdp, writeback=False, with_grads=True):
        for name, param in fsdp.named_parameters():
            name = clean_name(name)
            if name in wanted:
                found[name] = None if param.grad is None else float(param.grad.detach().float().norm())
    return {name: found.get(name) for name in names}


def _grad_norms_flat(fsdp: Any, names: list[str]) -> dict[str, float | None]:
    """Each original parameter's slice of its flat parameter's local gradient shard (FSDP's
    ``_fqns`` and ``_shard_param_infos``, read only), squared and summed over ranks."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel

    squares: dict[str, float] = {}  # -1: this rank has no gradient for it
    for module_name, module in fsdp.named_modules():
        if not isinstance(module, FullyShardedDataParallel):
            continue
        handle = getattr(module, "_handle", None)
        flat = getattr(handle, "flat_param", None)
        if flat is None:
            continue
        prefix = clean_name(module_name)
        for i, fqn in enumerate(flat._fqns):
            name = f"{prefix}.{fqn}" if prefix else fqn
            if flat.grad is None:
                squares[name] = -1.0
                continue
            info = flat._shard_param_infos[i]
            if not info.in_shard:
                squares[name] = 0.0
                continue
            part = flat.grad.detach().float()[info.offset_in_shard : info.offset_in_shard + info.numel_in_shard]
            squares[name] = float(part.pow(2).sum())
    device = next(fsdp.parameters()).device
    values = torch.tensor([squares.get(name, -1.0) for name in names], dtype=torch.float64, device=device)
    has_grad = torch.tensor(
        [0.0 if squares.get(name, -1.0) < 0 else 1.0 for name in names], dtype=torch.float64, device=device
    )
    values.clamp_(min=0.0)
    if dist.is_initialized():
        dist.all_reduce(values)
        dist.all_reduce(has_grad)
    return {
        name: (math.sqrt(v) if h > 0 else None)
        for name, v, h in zip(names, values.tolist(), has_grad.tolist(), strict=True)
    }
