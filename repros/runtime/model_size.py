"""The test model's size, part of the contract with the orchestrator: an item asks for ``tiny``
(correctness: a two-layer model, seconds) or ``small`` (measuring: tens of millions of parameters,
long sequences), the rank sets it once (``use_size``) and every model the trainer builds, and the
steps it trains, follow it (``repros/trainer/tiny_models.py`` builds the models)."""

from __future__ import annotations

from dataclasses import dataclass


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
