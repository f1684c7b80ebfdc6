"""Loading a base model the way FSDP's ``cpu_ram_efficient_loading`` does, and what it left on each rank.

``accelerate launch`` with ``fsdp_cpu_ram_efficient_loading: true`` (or its FSDP plugin with
``cpu_ram_efficient_loading=True``) exports ``ACCELERATE_USE_FSDP=true`` and
``FSDP_CPU_RAM_EFFICIENT_LOADING=true``; with both set and a process group up, transformers'
``is_fsdp_enabled()`` holds and ``from_pretrained`` reads the checkpoint on local rank 0 only. Every
other rank gets placeholders, to be overwritten by rank 0's broadcast: uninitialized memory
(``torch.empty_like``) on transformers 4.x and 5.4-5.5 (NaN, inf, 1e38 in any dtype), the model's random
initialization on 5.0-5.3, zeros from 5.6 (PR #45050) until a release that loads every rank's weights.

``load_base_ram_efficient`` loads the item's base checkpoint with those variables set (only while it
loads) and records, per rank, how the loaded weights compare with the checkpoint's (``placeholder_facts``).
``broadcast_from_rank0`` is the fixed trainer's guard: rank 0's full state dict broadcast into every
rank's FSDP2 shards after ``fully_shard``, what accelerate's ``fsdp2_load_full_state_dict`` does.

Heavy imports stay inside functions.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

#: What ``accelerate launch`` exports for an FSDP config with ``fsdp_cpu_ram_efficient_loading: true``.
RAM_EFFICIENT_LOADING_ENV = {"ACCELERATE_USE_FSDP": "true", "FSDP_CPU_RAM_EFFICIENT_LOADING": "true"}


@contextmanager
def ram_efficient_loading_env() -> Iterator[None]:
    """The accelerate FSDP variables set for the duration, the previous values restored after."""
    before = {name: os.environ.get(name) for name in RAM_EFFICIENT_LOADING_ENV}
    os.environ.update(RAM_EFFICIENT_LOADING_ENV)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def placeholder_facts(model: Any, checkpoint: Mapping[str, Any]) -> dict[str, Any]:
    """How this rank's loaded parameters compare with the checkpoint's: how many tensors equal it,
    how many elements are NaN or infinite, how many are zero where the checkpoint's are not."""
    import torch

    equal = differ = nan = inf = zero = elements = 0
    first_nonfinite: str | None = None
    for name, param in model.named_parameters():
        saved = checkpoint.get(name)
        if saved is None:
            continue
        value = param.detach()
        elements += value.numel()
        if value.shape == saved.shape and torch.equal(value, saved.to(value.dtype)):
            equal += 1
            continue
        differ += 1
        bad_nan = int(torch.isnan(value).sum())
        bad_inf = int(torch.isinf(value).sum())
        nan += bad_nan
        inf += bad_inf
        zero += int(((value == 0) & (saved.to(value.dtype) != 0)).sum()) if value.shape == saved.shape else 0
        if (bad_nan or bad_inf) and first_nonfinite is None:
            first_nonfinite = name
    return {
        "tensors_equal_to_checkpoint": equal,
        "tensors_differing": differ,
        "elements": elements,
        "nan_elements": nan,
        "inf_elements": inf,
        "zeroed_elements": zero,
        "first_nonfinite": first_nonfinite,
    }


def load_base_ram_efficient(base_dir: Path, facts: dict[str, Any]) -> Any:
    """The item's base checkpoint loaded with ``from_pretrained`` under FSDP's cpu_ram_efficient_loading
    (every rank calls it; the process group is up); what each rank got goes to ``facts``."""
    from safetensors.torch import load_file

    from repros.trainer.tiny_models import load_pretrained

    with ram_efficient_loading_env():
        # The family's class, as users load it (``AutoModelForCausalLM`` does not map a VLM's config; for a
        # text family it resolves to the same class).
        model = load_pretrained(str(base_dir))
    weights = base_dir / "model.safetensors"
    checkpoint = load_file(str(weights)) if weights.exists() else {}
    facts["placeholders"] = placeholder_facts(model, checkpoint)
    return model


def full_state_on_rank0(model: Any, rank: int) -> dict[str, Any]:
    """Rank 0's full state dict (detached copies), to broadcast after sharding; empty on other ranks."""
    if rank != 0:
        return {}
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def broadcast_from_rank0(model: Any, full_state: dict[str, Any]) -> None:
    """Rank 0's full state dict into every rank's FSDP2 shards (torch's ``set_model_state_dict`` with
    ``broadcast_from_rank0``; every rank calls it, the others with an empty dict)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, full_state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
