"""What a user does with the adapter once trained: save it as its engine documents, load it into a fresh base
model, merge it; and the same done with the reference's adapter, to compare (``compare.after_differences``).

Saving (every rank calls ``save``): one process, DDP, ZeRO 0-2 keep whole weights on every rank, so rank 0
calls PEFT's ``save_pretrained``; ZeRO-3 gathers the adapter first (``GatheredParameters``); FSDP1 and FSDP2
gather its full tensors with torch's ``get_model_state_dict`` and rank 0 hands them to ``save_pretrained``.
Loading and merging happen on rank 0 alone, in float32, as a user loads an adapter later.

Heavy imports stay inside functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from repros.trainer.crosscheck.strategy import Strategy
from repros.trainer.scenario import Scenario


def save(strategy: Strategy, scenario: Scenario, engine: Any, out: Path, rank: int) -> None:
    """Write the trained adapter to ``out`` (a collective: every rank calls it)."""
    import torch.distributed as dist

    model = engine.model
    if strategy.engine in ("fsdp1", "fsdp2"):
        state = _full_trainable_state(strategy, engine)
        if rank == 0:
            # PEFT's save_pretrained of the sharded model itself would read its wrapped modules (FSDP1 writes
            # an empty file so): the gathered tensors go through an unsharded twin of the model instead.
            _twin(scenario).save_pretrained(str(out), state_dict=state)
    elif strategy.engine == "deepspeed" and strategy.stage == 3:
        import deepspeed

        trainable = [p for p in model.parameters() if p.requires_grad]
        with deepspeed.zero.GatheredParameters(trainable, modifier_rank=None):
            if rank == 0:
                model.save_pretrained(str(out))
    elif rank == 0:
        model.save_pretrained(str(out))
    if dist.is_initialized():
        dist.barrier()


def _full_trainable_state(strategy: Strategy, engine: Any) -> dict[str, Any]:
    """The trainable parameters' full tensors on rank 0 (a collective), by their names in the model: FSDP1's
    ``FULL_STATE_DICT`` (rank 0 only), FSDP2's ``get_model_state_dict(full_state_dict=True)``."""
    trainable = {_unwrapped(name) for name, p in engine.model.named_parameters() if p.requires_grad}
    if strategy.engine == "fsdp1":
        from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel, StateDictType

        config = FullStateDictConfig(offload_to_cpu=False, rank0_only=True)
        with FullyShardedDataParallel.state_dict_type(engine.wrapped, StateDictType.FULL_STATE_DICT, config):
            state = engine.wrapped.state_dict()
    else:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
        state = get_model_state_dict(engine.wrapped, options=options)
    return {_unwrapped(k): v for k, v in state.items() if _unwrapped(k) in trainable}


def _twin(scenario: Scenario) -> Any:
    """A fresh, unsharded model with the scenario's adapter (its weights are replaced by what is saved)."""
    from peft import get_peft_model

    from repros.trainer.model import lora_config, target_modules_for

    base = _fresh_base(scenario)
    return get_peft_model(base, lora_config(scenario, target_modules_for(base, scenario)))


def _unwrapped(key: str) -> str:
    from repros.trainer.fsdp1 import clean_name

    return clean_name(key)


def drop_one_tensor(out: Path) -> str:
    """Remove the first adapter tensor from the saved file (a deliberate fault); returns its key."""
    from safetensors.torch import load_file, save_file

    path = out / "adapter_model.safetensors"
    tensors = load_file(str(path))
    dropped = str(sorted(tensors)[0])
    del tensors[dropped]
    save_file(tensors, str(path), metadata={"format": "pt"})
    return dropped


def _fresh_base(scenario: Scenario) -> Any:
    from repros.trainer.tiny_models import tiny_qwen2

    return tiny_qwen2(scenario.seed).eval()


def _logits(model: Any, batch: Any) -> Any:
    import torch

    from repros.trainer.tiny_models import model_inputs

    with torch.no_grad():
        return model(**model_inputs(batch)).logits.float()


def reference_adapter(scenario: Scenario, weights: dict[str, Any]) -> Any:
    """A fresh float32 base with the reference's final adapter weights put into it."""
    model = _twin(scenario)
    known = {name for name, _ in model.named_parameters()}
    absent = [name for name in weights if name not in known]
    if absent:
        raise RuntimeError(f"the reference's adapter does not fit a fresh model: {absent[:3]}")
    model.load_state_dict(dict(weights), strict=False)
    return model.eval()


def saved_precision(out: Path) -> str:
    """``bf16`` where the saved adapter's tensors are bfloat16, else ``fp32``."""
    from safetensors import safe_open

    with safe_open(str(out / "adapter_model.safetensors"), framework="pt") as f:
        dtypes = {str(f.get_slice(key).get_dtype()) for key in f.keys()}
    return "bf16" if any(d.upper() in ("BF16", "BFLOAT16") for d in dtypes) else "fp32"


def reload(scenario: Scenario, out: Path, names: list[str]) -> tuple[dict[str, Any], Any]:
    """The saved adapter loaded into a fresh base (PEFT's ``from_pretrained``): its tensors by the trained
    model's names, and the model. A tensor the file lacks is absent (PEFT leaves it as initialised and
    warns; the comparison names it missing)."""
    from peft import PeftModel
    from peft.utils import get_peft_model_state_dict
    from safetensors import safe_open

    with safe_open(str(out / "adapter_model.safetensors"), framework="pt") as f:
        in_file = set(f.keys())
    model = PeftModel.from_pretrained(_fresh_base(scenario), str(out)).eval()
    # Each parameter's key in the file, as PEFT spells it (the adapter's name left out, a DoRA magnitude's
    # ``.weight`` too): PEFT's own state dict of the model holds the parameters' very tensors.
    file_key = {t.data_ptr(): key for key, t in get_peft_model_state_dict(model).items()}
    loaded = {
        name: param.detach().float().clone()
        for name, param in model.named_parameters()
        if name in names and file_key.get(param.data_ptr()) in in_file
    }
    return loaded, model


def outputs(scenario: Scenario, reloaded: Any, reference: Any, probe: Any) -> dict[str, tuple[Any, Any, Any]]:
    """The reloaded and the merged models' outputs on ``probe``, each with the reference's and the base's."""
    base = _logits(_fresh_base(scenario), probe)
    found = {"reloaded_outputs": (_logits(reloaded, probe), _logits(reference, probe), base)}
    merged = _logits(reloaded.merge_and_unload(), probe)
    found["merged_outputs"] = (merged, _logits(reference.merge_and_unload(), probe), base)
    return found
