"""Sharding a model the way ``Accelerator.prepare`` does under an FSDP2 plugin.

transformers' ``Trainer`` and ``accelerate launch`` with ``fsdp_version: 2`` reach torch's ``fully_shard``
through accelerate's ``fsdp2_prepare_model``: it wraps each module the plugin's auto-wrap policy names (here
the decoder layers), then the root, under the plugin's mixed-precision policy, and decides which parameters
FSDP2 shards (from accelerate 1.14.0, PR #3987, it leaves non-float frozen bitsandbytes ``Params4bit`` out).
accelerate selects FSDP only for GPU runs; a CPU run is ``MULTI_CPU`` and ``prepare`` would use DDP, so the
plugin is set on the accelerator's state by hand and ``fsdp2_prepare_model`` is called as ``prepare`` would
(F14). Heavy imports stay inside functions.
"""

from __future__ import annotations

from typing import Any


def decoder_layer_classes(model: Any) -> list[str]:
    """The class names of the model's decoder layers (the plugin's ``transformer_cls_names_to_wrap``)."""
    from repros.trainer.tiny_models import is_decoder_layer

    return sorted({type(m).__name__ for m in model.modules() if is_decoder_layer(m)})


def prepare_fsdp2(model: Any, bf16: bool, on_cpu: bool) -> Any:
    """``model`` sharded by accelerate's ``fsdp2_prepare_model`` (every rank calls it; the process group is up)."""
    from accelerate import Accelerator, FullyShardedDataParallelPlugin
    from accelerate.utils import fsdp2_prepare_model

    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2,
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=decoder_layer_classes(model),
    )
    if bf16:
        plugin.set_mixed_precision("bf16")
    accelerator = Accelerator(cpu=on_cpu)
    accelerator.state.fsdp_plugin = plugin
    return fsdp2_prepare_model(accelerator, model)
