"""TRL's chunked cross-entropy SFT loss (``loss_type="chunked_nll"``) on the fixed trainer's model (F31).

``SFTTrainer`` (TRL 1.4.0 on) patches the causal LM's ``forward`` with ``_patch_chunked_ce_lm_head``: the
backbone runs, then the loss is computed from the last hidden states against ``lm_head.weight`` in chunks, so the
full logits never exist. It patches the transformers model inside a PEFT model (``get_base_model()``) before
``accelerator.prepare`` shards anything; ``patch_chunked_nll`` does the same with TRL's own function and chunk
size, passing what the installed release's signature takes. Heavy imports stay inside functions.
"""

from __future__ import annotations

import inspect
from typing import Any


def patch_chunked_nll(model: Any) -> None:
    from trl.trainer import sft_trainer

    target = model.get_base_model() if hasattr(model, "get_base_model") else model
    patch = sft_trainer._patch_chunked_ce_lm_head
    kwargs: dict[str, Any] = {"chunk_size": getattr(sft_trainer, "_CHUNKED_LM_HEAD_CHUNK_SIZE", 8), "is_vlm": False}
    if "with_peft" in inspect.signature(patch).parameters:
        kwargs["with_peft"] = target is not model
    patch(target, **kwargs)
