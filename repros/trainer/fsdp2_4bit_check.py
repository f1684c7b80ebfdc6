"""Does FSDP2 leave a 4-bit model's forward as it was? (F24.)

The test model is loaded quantized (``repros/trainer/quantized.py``, the scenario's 4-bit storage), its logits on
the fixed batch taken, the model sharded as the fixed trainer's FSDP2 engine shards it (each decoder layer, then
the root), and the logits taken again: any difference is ``ShardedForwardDiffers``, with how many of the packed
elements were bf16 NaN bit patterns before sharding (the bytes FSDP2's parameter swap on CUDA rewrites). Only
forwards run (no adapter, no step), so nothing but the sharding can change the logits. Heavy imports stay inside.
"""

from __future__ import annotations

from typing import Any

from repros.trainer.scenario import Scenario
from repros.trainer.silent_failures import ShardedForwardDiffers


def check_sharded_forward(scenario: Scenario, ctx: Any) -> None:
    import torch

    from repros.trainer.fixed_trainer import decoder_layers
    from repros.trainer.fsdp2 import fully_shard
    from repros.trainer.quantized import load_quantized_tiny_qwen2
    from repros.trainer.tiny_models import fixed_batch, model_inputs

    # Placed as transformers places a quantized model (a GPU rank's current device), as the fixed trainer loads it.
    model = load_quantized_tiny_qwen2(
        "nf4", no_repack=scenario.bnb_no_repack, quant_storage=scenario.bnb_4bit_quant_storage
    )
    packed = [m.weight for m in model.modules() if type(m).__name__ == "Linear4bit"]
    nan_patterns = sum(int(torch.isnan(w.data).sum()) for w in packed if w.dtype.is_floating_point)
    batch = fixed_batch(ctx.rank).to(ctx.device)
    with torch.no_grad():
        before = model(**model_inputs(batch)).logits.float()
    for layer in decoder_layers(model):
        fully_shard(layer)
    fully_shard(model)
    with torch.no_grad():
        after = model(**model_inputs(batch)).logits.float()
    diff = float((after - before).abs().max())
    ctx.facts["sharded_forward"] = {
        "storage": str(packed[0].dtype) if packed else None,
        "packed_elements": sum(w.numel() for w in packed),
        "nan_bit_patterns": nan_patterns,
        "max_logits_diff": diff,
    }
    if diff != 0.0:
        raise ShardedForwardDiffers(
            f"forward differs after fully_shard: max |logits diff| {diff:.4g}; {nan_patterns} of "
            f"{sum(w.numel() for w in packed)} packed 4-bit elements ({packed[0].dtype}) were bf16 NaN bit patterns"
        )
