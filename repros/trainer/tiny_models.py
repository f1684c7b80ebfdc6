"""The test models: causal LMs with random weights, built from transformers configs (no hub).

Two sizes. ``tiny`` (the default) is for correctness: a two-layer Qwen2 with hidden 64, where
every documented failure shows as it does in a real model, in seconds. ``small`` is for
measuring: tens of millions of parameters and long sequences, so that activation memory
dominates and a workaround's cost (checkpointing on or off, ZeRO-2 or 3) shows above the
imported libraries. An item's size comes from the matrix (``model:``) or ``--model``; the rank
sets it once (``use_size``) and every model it builds is of that size.
"""

from __future__ import annotations

from typing import Any

from repros.runtime.model_size import current_size

VOCAB_SIZE = 128


def _decoder_shape() -> dict[str, int]:
    """The widths and depth every test model shares, at the current size, and its vocabulary."""
    size = current_size()
    return {
        "vocab_size": VOCAB_SIZE,
        "hidden_size": size.hidden_size,
        "intermediate_size": size.intermediate_size,
        "num_hidden_layers": size.num_hidden_layers,
        "num_attention_heads": size.num_attention_heads,
        "num_key_value_heads": size.num_key_value_heads,
        "max_position_embeddings": size.max_position_embeddings,
    }


def tiny_qwen2(seed: int = 0) -> Any:
    """The test model at the current size (``tiny`` unless the item asked for another):
    a Qwen2-style decoder, vocabulary 128, untied embeddings, seeded random weights."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        **_decoder_shape(),
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


def tiny_mixtral(num_experts: int, experts_per_token: int = 2, seed: int = 0) -> Any:
    """A mixture-of-experts decoder at the current size (``MixtralForCausalLM``): the test model's
    attention and widths, each layer's MLP ``num_experts`` experts of which the router picks
    ``experts_per_token`` per token; vocabulary 128, untied embeddings, seeded random weights. With
    more experts than a rank's batch has tokens, some experts get none on one rank and some on another."""
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(
        **_decoder_shape(),
        num_local_experts=num_experts,
        num_experts_per_tok=experts_per_token,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return MixtralForCausalLM(config)


def fixed_batch(rank: int, batch_size: int | None = None, seq_len: int | None = None, seed: int = 1) -> Any:
    """The same token batch every step (so a working trainer's loss must fall), different per
    rank (so data parallelism has something to average); its shape is the current size's unless given."""
    import torch

    generator = torch.Generator().manual_seed(seed + rank)
    size = current_size()
    shape = (batch_size or size.batch_size, seq_len or size.seq_len)
    return torch.randint(0, VOCAB_SIZE, shape, generator=generator)
