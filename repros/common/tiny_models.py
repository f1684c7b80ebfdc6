"""The test models: causal LMs with random weights, built from transformers configs (no hub).

Two sizes. ``tiny`` (the default) is for correctness: a two-layer Qwen2 with hidden 64, where
every documented failure shows as it does in a real model, in seconds. ``small`` is for
measuring: tens of millions of parameters and long sequences, so that activation memory
dominates and a workaround's cost (checkpointing on or off, ZeRO-2 or 3) shows above the
imported libraries. An item's size comes from the matrix (``model:``) or ``--model``; the rank
sets it once (``use_size``) and every model it builds is of that size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

VOCAB_SIZE = 128


@dataclass(frozen=True)
class ModelSize:
    name: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int
    #: The batch each rank trains on, per step.
    batch_size: int
    seq_len: int
    #: Steps trained, of which the first ``warmup_steps`` are not timed (``None``: the repro's own).
    steps: int | None = None
    warmup_steps: int | None = None


SIZES: dict[str, ModelSize] = {
    "tiny": ModelSize("tiny", 64, 128, 2, 4, 2, 64, batch_size=2, seq_len=16),
    # ~20.6M parameters (8 layers of hidden 512, MLP 1152): a 512-token sequence's activations
    # are what checkpointing trades for time. Sized so a step takes about 3 CPU-seconds here.
    "small": ModelSize("small", 512, 1152, 8, 8, 4, 512, batch_size=1, seq_len=512, steps=10, warmup_steps=2),
}
_current = SIZES["tiny"]


def use_size(name: str) -> ModelSize:
    """Every model built from now on in this process is of size ``name``."""
    global _current
    if name not in SIZES:
        raise ValueError(f"unknown model size {name!r}; known: {', '.join(SIZES)}")
    _current = SIZES[name]
    return _current


def current_size() -> ModelSize:
    return _current


def tiny_qwen2(seed: int = 0) -> Any:
    """The test model at the current size (``tiny`` unless the item asked for another):
    a Qwen2-style decoder, vocabulary 128, untied embeddings, seeded random weights."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    size = _current
    config = Qwen2Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=size.hidden_size,
        intermediate_size=size.intermediate_size,
        num_hidden_layers=size.num_hidden_layers,
        num_attention_heads=size.num_attention_heads,
        num_key_value_heads=size.num_key_value_heads,
        max_position_embeddings=size.max_position_embeddings,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


def fixed_batch(rank: int, batch_size: int | None = None, seq_len: int | None = None, seed: int = 1) -> Any:
    """The same token batch every step (so a working trainer's loss must fall), different per
    rank (so data parallelism has something to average); its shape is the current size's unless given."""
    import torch

    generator = torch.Generator().manual_seed(seed + rank)
    shape = (batch_size or _current.batch_size, seq_len or _current.seq_len)
    return torch.randint(0, VOCAB_SIZE, shape, generator=generator)
