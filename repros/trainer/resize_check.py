"""After training a model whose vocabulary was resized: do its embedding, its LM head and its
config agree on the vocabulary size? Under ZeRO-3 a resize can leave them apart without an error
(an embedding whose partitioned shape kept the old vocabulary); training then runs for as long as
the batches hold only old token ids. Standard library at import; torch and DeepSpeed inside.
"""

from __future__ import annotations

from typing import Any


class ResizedEmbeddingsInconsistent(Exception):
    """Training ran, but the resized embedding, LM head and config disagree on the vocabulary."""


def vocabulary_sizes(model: Any) -> dict[str, int]:
    """Rows of the input embedding and of the LM head as trained (gathered under ZeRO-3; every rank
    must call it), and ``config.vocab_size``."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    embedding, head = base.get_input_embeddings().weight, base.get_output_embeddings().weight
    params = [embedding, head]
    if any(hasattr(p, "ds_id") for p in params):
        import deepspeed

        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            rows = int(embedding.shape[0]), int(head.shape[0])
    else:
        rows = int(embedding.shape[0]), int(head.shape[0])
    return {"embedding_rows": rows[0], "lm_head_rows": rows[1], "config_vocab_size": config_vocab_size(base.config)}


def config_vocab_size(config: Any) -> int:
    """The vocabulary the config says: a vision-language model's is its text config's (``LlavaConfig`` has
    none of its own in transformers 5, and ``resize_token_embeddings`` updates the text config's)."""
    if hasattr(config, "get_text_config"):
        text = config.get_text_config()
    else:  # transformers before 4.45: a LlavaConfig's text config is an attribute only
        text = getattr(config, "text_config", None) or config
    size = getattr(text, "vocab_size", None)
    return int(size if size is not None else config.vocab_size)


def raise_if_inconsistent(sizes: dict[str, int], at_least: int) -> None:
    values = set(sizes.values())
    if len(values) != 1 or min(values) < at_least:
        raise ResizedEmbeddingsInconsistent(
            f"resized embeddings inconsistent after training: embedding rows {sizes['embedding_rows']}, LM head rows "
            f"{sizes['lm_head_rows']}, config.vocab_size {sizes['config_vocab_size']}; the resize asked for at least "
            f"{at_least}"
        )
