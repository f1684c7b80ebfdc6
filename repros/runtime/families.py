"""The model families, part of the contract with the orchestrator: an item asks for one (``family`` in its
params, default ``qwen2``), the rank sets it once (``use_family``) and every test model the trainer builds is
of that family (``repros/trainer/tiny_models.py`` builds them), at the item's size.

Standard library only: the orchestrator reads the names, the smallest transformers release that has each,
and the traits that decide which documented failures can occur in it; it never imports transformers.
"""

from __future__ import annotations

from dataclasses import dataclass

from repros.runtime.registry import Registry

#: The family every repro ran on before families existed, and runs on unless an item asks for another.
DEFAULT_FAMILY = "qwen2"


@dataclass(frozen=True)
class Family:
    name: str
    #: The transformers class of the causal LM (the VLM's conditional-generation class).
    model_class: str
    #: The first transformers release with the architecture (a cell before it excludes the family).
    min_transformers: str
    #: What makes it structurally itself, kept at both sizes.
    traits: str
    #: Where the projections a Llama recipe names (``q_proj``, ``gate_proj``, ...) live in this family, where
    #: it fuses them (Phi-3: query, key and value in one ``qkv_proj``, gate and up in one ``gate_up_proj``);
    #: a name not listed is the family's own. Target modules are resolved per family by it
    #: (``repros/trainer/targets.py``).
    fused_targets: tuple[tuple[str, str], ...] = ()
    tied_embeddings: bool = False
    #: Mixture of experts: each layer's MLP a set of experts behind a router.
    moe: bool = False
    #: A vision tower (frozen) before the language model.
    vision: bool = False
    #: The attention implementation the family needs for training (``None``: transformers' default).
    attn_implementation: str | None = None

    @property
    def fused_projections(self) -> bool:
        return bool(self.fused_targets)

    def target_name(self, name: str) -> str:
        """Where the module a Llama recipe calls ``name`` lives in this family."""
        return dict(self.fused_targets).get(name, name)


_BUILT_IN: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            "qwen2",
            "Qwen2ForCausalLM",
            "4.37.0",
            "grouped-query attention (2 query heads per KV head), q/k/v biases, untied embeddings",
        ),
        Family(
            "llama",
            "LlamaForCausalLM",
            "4.28.0",
            "grouped-query attention, no biases, untied embeddings",
        ),
        Family(
            "mistral",
            "MistralForCausalLM",
            "4.34.0",
            "grouped-query attention with a sliding window shorter than the sequence",
        ),
        Family(
            "gemma2",
            "Gemma2ForCausalLM",
            "4.42.0",
            "tied embeddings, attention and final logits soft-capped, alternating sliding-window layers, "
            "eager attention for training",
            tied_embeddings=True,
            attn_implementation="eager",
        ),
        Family(
            "phi3",
            "Phi3ForCausalLM",
            "4.40.0",
            "fused projections: one qkv_proj and one gate_up_proj per layer",
            fused_targets=(
                ("q_proj", "qkv_proj"),
                ("k_proj", "qkv_proj"),
                ("v_proj", "qkv_proj"),
                ("gate_proj", "gate_up_proj"),
                ("up_proj", "gate_up_proj"),
            ),
        ),
        Family(
            "qwen2-moe",
            "Qwen2MoeForCausalLM",
            "4.40.0",
            "mixture of experts (8 experts, top-2, and a shared expert per layer)",
            moe=True,
        ),
        Family(
            "llava",
            "LlavaForConditionalGeneration",
            "4.36.0",
            "a frozen CLIP vision tower and projector before a Llama language model; image tokens in the batch",
            vision=True,
        ),
    )
}

#: Every model family, by name (``repros/runtime/registry.py``).
FAMILIES: Registry[Family] = Registry("model family", _BUILT_IN)

_current = FAMILIES[DEFAULT_FAMILY]


def use_family(name: str) -> Family:
    """Every test model built from now on in this process is of family ``name``."""
    global _current
    if name not in FAMILIES:
        raise ValueError(f"unknown model family {name!r}; known: {', '.join(FAMILIES)}")
    _current = FAMILIES[name]
    return _current


def current_family() -> Family:
    return _current
