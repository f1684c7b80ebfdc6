"""Tiny causal LMs with random weights, built from transformers configs (no hub)."""

from __future__ import annotations

from typing import Any

VOCAB_SIZE = 128


def tiny_qwen2(seed: int = 0) -> Any:
    """A two-layer Qwen2-style decoder: hidden 64, 4 heads, 2 KV heads."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


def fixed_batch(rank: int, batch_size: int, seq_len: int, seed: int = 1) -> Any:
    """The same token batch every step (so a working trainer's loss must fall),
    different per rank (so data parallelism has something to average)."""
    import torch

    generator = torch.Generator().manual_seed(seed + rank)
    return torch.randint(0, VOCAB_SIZE, (batch_size, seq_len), generator=generator)
