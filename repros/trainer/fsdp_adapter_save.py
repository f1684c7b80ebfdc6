"""Saving an FSDP2-sharded adapter the way transformers' ``Trainer`` checkpoints it, and checking the file.

Under FSDP, ``Trainer._save_checkpoint`` calls accelerate's ``save_fsdp_model(plugin, accelerator, model,
dir, adapter_only=True)`` for a PEFT model (``get_fsdp_ckpt_kwargs()`` passes ``adapter_only`` whenever
``save_fsdp_model`` takes it). With FSDP2 and ``FULL_STATE_DICT`` accelerate before 1.15.0 (PR #4206)
takes the adapter from PEFT's ``get_peft_model_state_dict``: FSDP2's parameters are DTensors, nothing
gathers them, and rank 0 writes ``pytorch_model_fsdp.bin`` holding its own shard of every adapter
tensor; resuming from it restores rank 0's slice only.

``save_like_trainer`` makes that call (every rank). ``save_full_adapter`` is the fixed trainer's guard:
the adapter's full tensors gathered by torch's ``get_model_state_dict`` (``full_state_dict``,
``ignore_frozen_params``) and written by rank 0 under the same name, what accelerate does from 1.15.0.
``check_saved_adapter`` (rank 0) compares the file with the trained adapter's full tensors.

Heavy imports stay inside functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: The file accelerate writes for a ``FULL_STATE_DICT`` save of the first model.
FSDP_MODEL_FILE = "pytorch_model_fsdp.bin"


def _adapter_key(name: str) -> str:
    """A parameter's name as PEFT's adapter state dict spells it (no adapter name)."""
    return name.replace(".default.", ".")


def full_adapter_state(model: Any) -> dict[str, Any]:
    """The trainable parameters' full tensors (every rank calls it: a DTensor gathers), float32 on CPU,
    keyed as PEFT's adapter state dict."""
    state: dict[str, Any] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        value = param.detach()
        if hasattr(value, "full_tensor"):
            value = value.full_tensor()
        state[_adapter_key(name)] = value.float().cpu().clone()
    return state


def save_like_trainer(model: Any, out: Path) -> None:
    """accelerate's ``save_fsdp_model`` with an FSDP2 ``FULL_STATE_DICT`` plugin and ``adapter_only=True``,
    as ``Trainer._save_checkpoint`` calls it (every rank)."""
    from accelerate import Accelerator, FullyShardedDataParallelPlugin
    from accelerate.utils import save_fsdp_model

    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="FULL_STATE_DICT")
    save_fsdp_model(plugin, Accelerator(cpu=True), model, str(out), adapter_only=True)


def save_full_adapter(model: Any, out: Path, rank: int) -> None:
    """The adapter's full tensors (torch's ``get_model_state_dict``, ``full_state_dict``, frozen
    parameters left out) written by rank 0 as accelerate's file (every rank calls it)."""
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
    state = get_model_state_dict(model, options=options)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        torch.save(state, str(out / FSDP_MODEL_FILE))


def _describe(value: Any) -> tuple[Any, str]:
    """A saved value as a plain tensor (a DTensor's local shard) and how it was stored."""
    if hasattr(value, "to_local"):
        local = value.to_local()
        return local, f"a DTensor of global shape {tuple(value.shape)} holding a local shard {tuple(local.shape)}"
    return value, f"a tensor of shape {tuple(value.shape)}"


def saved_adapter_facts(path: Path, trained: Mapping[str, Any]) -> dict[str, Any]:
    """How the saved file's tensors compare with the trained adapter's full tensors."""
    import torch

    saved = torch.load(str(path), map_location="cpu", weights_only=False)
    saved = {_adapter_key(k): v for k, v in saved.items()}
    complete, incomplete = [], {}
    for name, full in trained.items():
        if name not in saved:
            incomplete[name] = "missing"
            continue
        local, stored = _describe(saved[name])
        if tuple(local.shape) == tuple(full.shape) and torch.equal(local.float(), full):
            complete.append(name)
        else:
            incomplete[name] = f"{stored}, trained {tuple(full.shape)}"
    return {
        "file": path.name,
        "bytes": path.stat().st_size,
        "tensors": len(trained),
        "complete": len(complete),
        "incomplete": incomplete,
    }


def check_saved_adapter(facts: Mapping[str, Any]) -> None:
    """``SavedAdapterIncomplete`` when a tensor of the saved adapter is not the trained one's full tensor."""
    from repros.trainer.silent_failures import SavedAdapterIncomplete

    incomplete: Mapping[str, str] = facts["incomplete"]
    if not incomplete:
        return
    name, why = next(iter(incomplete.items()))
    raise SavedAdapterIncomplete(
        f"saved adapter incomplete: {len(incomplete)} of {facts['tensors']} tensors in {facts['file']} "
        f"({facts['bytes']} bytes) are not the trained adapter's full tensors; {name}: {why}"
    )


def save_and_check(model: Any, work: Path, rank: int, full_state_dict: bool, facts: dict[str, Any]) -> None:
    """Save the trained adapter (accelerate's call, or the guard's gather), then on rank 0 compare the
    file with the trained full tensors; what was found goes to ``facts["fsdp_adapter_save"]``."""
    import torch.distributed as dist

    out = work / "checkpoint"
    trained = full_adapter_state(model)
    if full_state_dict:
        save_full_adapter(model, out, rank)
    else:
        save_like_trainer(model, out)
    if dist.is_initialized():
        dist.barrier()
    found: list[dict[str, Any] | None] = [None]
    if rank == 0:
        found[0] = {"method": "full_state_dict" if full_state_dict else "accelerate"} | saved_adapter_facts(
            out / FSDP_MODEL_FILE, trained
        )
    if dist.is_initialized():
        dist.broadcast_object_list(found, src=0)
    assert found[0] is not None
    facts["fsdp_adapter_save"] = found[0]
    check_saved_adapter(found[0])
