"""A mixture-of-experts base checkpoint, as published ones are laid out, and a check that it loaded (F29, F32).

Published Mixtral (and Qwen-MoE) checkpoints keep one tensor per expert and projection
(``model.layers.N.block_sparse_moe.experts.E.w1.weight``, ``w2``, ``w3``). transformers 5 keeps each layer's
experts in one module of fused 3D weights (``mlp.experts.gate_up_proj`` ``[E, 2I, H]``, ``down_proj``
``[E, H, I]``) and converts the published layout as it loads (its ``conversion_mapping``: ``block_sparse_moe``
renamed ``mlp``, ``w1`` and ``w3`` merged into ``gate_up_proj``, ``w2`` into ``down_proj``). Saving the test
model with ``save_pretrained`` in transformers 5 writes the fused layout, which needs no conversion; so
``save_moe_checkpoint`` writes the published layout itself (transformers 4.x writes it as it is).

``check_loaded_as_saved`` compares the model a rank loaded (whole, or ZeRO-3 partitioned: each parameter
gathered in turn) with the same checkpoint loaded whole, outside ZeRO-3 (``reference_state``), and raises
``LoadedNotCheckpoint`` where any parameter differs: the silent form of F32, a partitioned model left at its
random initialization.
Heavy imports stay inside functions.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from repros.trainer.silent_failures import LoadedNotCheckpoint

#: transformers' fused expert weights, per layer.
_FUSED = re.compile(r"^(?P<prefix>.*\.)mlp\.experts\.(?P<name>gate_up_proj|down_proj)$")
_GATE = re.compile(r"^(?P<prefix>.*\.)mlp\.gate\.weight$")


def published_layout(state: dict[str, Any]) -> dict[str, Any]:
    """A transformers-5 Mixtral state dict in the published per-expert layout (the inverse of its conversion)."""
    out: dict[str, Any] = {}
    for key, value in state.items():
        fused, gate = _FUSED.match(key), _GATE.match(key)
        if gate:
            out[f"{gate['prefix']}block_sparse_moe.gate.weight"] = value
        elif fused and fused["name"] == "gate_up_proj":
            w1, w3 = value.chunk(2, dim=1)
            for e in range(value.shape[0]):
                out[f"{fused['prefix']}block_sparse_moe.experts.{e}.w1.weight"] = w1[e].contiguous()
                out[f"{fused['prefix']}block_sparse_moe.experts.{e}.w3.weight"] = w3[e].contiguous()
        elif fused:
            for e in range(value.shape[0]):
                out[f"{fused['prefix']}block_sparse_moe.experts.{e}.w2.weight"] = value[e].contiguous()
        else:
            out[key] = value.contiguous()
    return out


def save_moe_checkpoint(base_dir: Path, num_experts: int, per_expert: bool) -> None:
    """The tiny Mixtral written to ``base_dir``: in the published per-expert layout where ``per_expert``."""
    from safetensors.torch import save_file

    from repros.trainer.tiny_models import tiny_mixtral

    model = tiny_mixtral(num_experts)
    if not per_expert:
        model.save_pretrained(str(base_dir))
        return
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if any(_FUSED.match(k) for k in state):
        state = published_layout(state)
    base_dir.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(str(base_dir))
    save_file(state, str(base_dir / "model.safetensors"), metadata={"format": "pt"})


def load_moe(base_dir: Path) -> Any:
    from transformers import MixtralForCausalLM

    return MixtralForCausalLM.from_pretrained(str(base_dir))


def is_moe_checkpoint(base_dir: Path) -> bool:
    import json

    config = base_dir / "config.json"
    return config.is_file() and json.loads(config.read_text()).get("model_type") == "mixtral"


def reference_state(base_dir: Path) -> dict[str, Any]:
    """The checkpoint loaded whole (call it while no ``HfDeepSpeedConfig`` is alive): what every load of it must
    give, each parameter by name."""
    return {name: p.detach().float().clone() for name, p in load_moe(base_dir).named_parameters()}


def check_loaded_as_saved(model: Any, reference: dict[str, Any], facts: dict[str, Any]) -> None:
    """Raise ``LoadedNotCheckpoint`` where a parameter of ``model`` (the base model as loaded, before any adapter)
    is not ``reference``'s; under ZeRO-3 every rank gathers each parameter in turn (collectives: all ranks call it)."""
    import torch

    differ: list[str] = []
    for name, param in model.named_parameters():
        if hasattr(param, "ds_id"):
            import deepspeed

            with deepspeed.zero.GatheredParameters([param]):
                same = name in reference and torch.equal(param.data.float(), reference[name])
        else:
            same = name in reference and torch.equal(param.data.float(), reference[name])
        if not same:
            differ.append(name)
    facts["loaded_as_saved"] = {"parameters": len(reference), "differ": len(differ), "first": differ[:3]}
    if differ:
        raise LoadedNotCheckpoint(
            f"loaded weights are not the checkpoint's: {len(differ)} of {len(reference)} parameters differ from the "
            f"same checkpoint loaded whole (e.g. {differ[0]})"
        )
