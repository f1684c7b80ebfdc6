"""The test models: causal LMs with random weights, built from transformers configs (no hub).

Two sizes. ``tiny`` (the default) is for correctness: a two-layer decoder with hidden 64, where
every documented failure shows as it does in a real model, in seconds. ``small`` is for
measuring: tens of millions of parameters and long sequences, so that activation memory
dominates and a workaround's cost (checkpointing on or off, ZeRO-2 or 3) shows above the
imported libraries. An item's size comes from the matrix (``model:``) or ``--model``; the rank
sets it once (``use_size``) and every model it builds is of that size.

Several families (``repros/runtime/families.py``): Qwen2 (the default), Llama, Mistral, Gemma-2, Phi-3,
Qwen2-MoE and LLaVA (a frozen CLIP vision tower before a Llama). The rank sets the item's family once
(``use_family``) and ``test_model`` (alias ``tiny_qwen2``, the name the trainer always called) builds it,
at the current size, keeping the structural traits that decide which documented failures can occur in it.
Everything that calls a model goes through ``model_inputs``, which adds what a family needs besides the
token ids (LLaVA's image).
"""

from __future__ import annotations

from typing import Any

from repros.runtime.families import current_family
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


def _sliding_window() -> int:
    """A sliding window shorter than the current size's sequence (half of it), so that it masks."""
    return max(2, current_size().seq_len // 2)


def _head_dim() -> int:
    size = current_size()
    return size.hidden_size // size.num_attention_heads


#: The CLIP vision tower of the LLaVA test model, per size: hidden, layers, heads, MLP, image side, patch side.
#: ``tiny`` sees a 28x28 image as 4 patches of 14; ``small`` a 112x112 image as 64. No width below 64:
#: bitsandbytes quantizes 4-bit weights in blocks of 64 inputs, and its CPU path cannot pack a narrower layer
#: (``shape '[32, 0]' is invalid``), which no real CLIP (hidden 768 and up) meets.
_VISION_SHAPES: dict[str, tuple[int, int, int, int, int, int]] = {
    "tiny": (64, 2, 2, 128, 28, 14),
    "small": (256, 4, 4, 1024, 112, 14),
}
#: The LLaVA test model's image token: an id inside the vocabulary (the last one), never drawn as text.
IMAGE_TOKEN_ID = VOCAB_SIZE - 1


def image_tokens_per_image() -> int:
    """How many image tokens one image becomes in the LLaVA test model (its patches: CLS dropped)."""
    _, _, _, _, image, patch = _VISION_SHAPES[current_size().name]
    return (image // patch) ** 2


def image_tokens_in_a_row() -> int:
    """How many image tokens a batch row carries for its image. A LLaVA of transformers before 4.47
    expands each image token into the image's patches itself (``_merge_input_ids_with_image_features``:
    one token per image, as its processor wrote them then); later ones expect the processor to have
    written one token per patch."""
    import transformers

    if hasattr(transformers.LlavaForConditionalGeneration, "_merge_input_ids_with_image_features"):
        return 1
    return image_tokens_per_image()


def _family_config(experts: int | None = None) -> Any:
    """The transformers config of the current family at the current size (no hub: built from the class);
    a mixture of experts with ``experts`` experts per layer where given (else the family's 8)."""
    import transformers

    family = current_family()
    shape = _decoder_shape()
    attn = {"attn_implementation": family.attn_implementation} if family.attn_implementation else {}
    if family.name == "qwen2":
        return transformers.Qwen2Config(**shape, tie_word_embeddings=False)
    if family.name == "llama":
        return transformers.LlamaConfig(**shape, tie_word_embeddings=False)
    if family.name == "mistral":
        return transformers.MistralConfig(**shape, sliding_window=_sliding_window(), tie_word_embeddings=False)
    if family.name == "gemma2":
        # Gemma-2's own soft-capping (attention 50, final logits 30: the config's defaults, left as they are),
        # tied embeddings, alternating sliding-window and global layers; head_dim from the size (the config's
        # default is 7B's 256) and the query scaled by it, as Gemma-2 2B/9B do.
        return transformers.Gemma2Config(
            **shape,
            head_dim=_head_dim(),
            query_pre_attn_scalar=_head_dim(),
            sliding_window=_sliding_window(),
            tie_word_embeddings=True,
            pad_token_id=0,
            bos_token_id=2,
            eos_token_id=1,
            **attn,
        )
    if family.name == "phi3":
        # Phi-3's defaults name ids of its 32k vocabulary (pad 32000): inside the test vocabulary instead.
        return transformers.Phi3Config(
            **shape, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2
        )
    if family.name == "qwen2-moe":
        size = current_size()
        # Qwen1.5-MoE's proportions: each expert's MLP a quarter of the shared expert's, which is the dense MLP.
        return transformers.Qwen2MoeConfig(
            **shape,
            num_experts=experts or 8,
            num_experts_per_tok=2,
            moe_intermediate_size=size.intermediate_size // 4,
            shared_expert_intermediate_size=size.intermediate_size,
            decoder_sparse_step=1,
            tie_word_embeddings=False,
        )
    if family.name == "llava":
        hidden, layers, heads, mlp, image, patch = _VISION_SHAPES[current_size().name]
        return transformers.LlavaConfig(
            vision_config=transformers.CLIPVisionConfig(
                hidden_size=hidden,
                num_hidden_layers=layers,
                num_attention_heads=heads,
                intermediate_size=mlp,
                image_size=image,
                patch_size=patch,
                projection_dim=hidden,
            ),
            text_config=transformers.LlamaConfig(**shape, tie_word_embeddings=False),
            image_token_index=IMAGE_TOKEN_ID,
            image_seq_length=image_tokens_per_image(),
            tie_word_embeddings=False,
        )
    raise ValueError(f"no test model for family {family.name!r}")


def model_class() -> Any:
    """The transformers class of the current family's model (the VLM's conditional-generation class)."""
    import transformers

    return getattr(transformers, current_family().model_class)


def test_model(seed: int = 0, experts: int | None = None) -> Any:
    """The test model of the current family at the current size (``qwen2`` and ``tiny`` unless the item
    asked for others), vocabulary 128, seeded random weights; a VLM's vision tower and projector frozen;
    a mixture-of-experts family with ``experts`` experts per layer where given."""
    import torch

    config = _family_config(experts)
    torch.manual_seed(seed)
    model = model_class()(config)
    if current_family().vision:
        for name, module in model.named_modules():
            if name.rsplit(".", 1)[-1] in VISION_MODULES:
                module.requires_grad_(False)
    return model


def tiny_qwen2(seed: int = 0) -> Any:
    """``test_model(seed)``: the name every caller has used since the test model was a Qwen2 only. It
    builds the current family's model (so a ``family`` item's every model follows it)."""
    return test_model(seed)


def load_pretrained(directory: str, **kwargs: Any) -> Any:
    """A test-model checkpoint loaded with the current family's class, as users load one (``from_pretrained``),
    with the attention implementation the family trains with."""
    family = current_family()
    if family.attn_implementation and "attn_implementation" not in kwargs:
        kwargs["attn_implementation"] = family.attn_implementation
    return model_class().from_pretrained(directory, **kwargs)


#: The modules of a VLM before its language model (the last component of their names): frozen.
VISION_MODULES = ("vision_tower", "multi_modal_projector")


def is_decoder_layer(module: Any) -> bool:
    """Whether ``module`` is one of the language model's decoder layers: what FSDP shards as a unit and
    checkpointing recomputes. Every family names them ``<Family>DecoderLayer`` (LLaVA: its Llama's).

    A VLM's CLIP encoder layers (``CLIPEncoderLayer``) are not units of their own: the tower is frozen and
    runs once, before the language model, with nothing of it trained, so its parameters stay in the root's
    unit (gathered with it under FSDP2, partitioned per module under ZeRO-3 anyway). As separate units they
    would save only the tower's own memory, a few percent of a LLaVA's; the recipes that wrap them do so
    for towers of billions of parameters."""
    return type(module).__name__.endswith("DecoderLayer")


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


def moe_test_model(num_experts: int, seed: int = 0) -> Any:
    """A mixture-of-experts test model with ``num_experts`` experts per layer: the current family's own
    where it is one (Qwen2-MoE), else a Mixtral (what F21 trains in the dense families' place)."""
    from repros.runtime.families import current_family

    return test_model(seed, experts=num_experts) if current_family().moe else tiny_mixtral(num_experts, seed=seed)


def fixed_batch(rank: int, batch_size: int | None = None, seq_len: int | None = None, seed: int = 1) -> Any:
    """The same token batch every step (so a working trainer's loss must fall), different per
    rank (so data parallelism has something to average); its shape is the current size's unless given.
    For a vision family each row opens with one image's tokens, and no text token is the image token."""
    import torch

    generator = torch.Generator().manual_seed(seed + rank)
    size = current_size()
    shape = (batch_size or size.batch_size, seq_len or size.seq_len)
    high = VOCAB_SIZE - 1 if current_family().vision else VOCAB_SIZE
    batch = torch.randint(0, high, shape, generator=generator)
    if current_family().vision:
        batch[:, : image_tokens_in_a_row()] = IMAGE_TOKEN_ID
    return batch


def model_inputs(batch: Any, labels: bool = False) -> dict[str, Any]:
    """The keyword arguments of a forward of the test model on ``batch`` (token ids), ``labels`` the batch
    itself when asked. A vision family's forward also gets the images its image tokens stand for (one
    fixed random image per row, seeded by the batch: the same every step, different per rank), so the
    frozen vision tower really runs; its labels ignore the image positions (-100), as LLaVA's collators do."""
    inputs: dict[str, Any] = {"input_ids": batch}
    if labels:
        inputs["labels"] = batch
    if not current_family().vision:
        return inputs
    import torch

    _, _, _, _, image, _ = _VISION_SHAPES[current_size().name]
    generator = torch.Generator().manual_seed(int(batch.detach().long().sum().cpu()))
    pixels = torch.randn((batch.shape[0], 3, image, image), generator=generator)
    inputs["pixel_values"] = pixels.to(batch.device)
    # A LLaVA before transformers 4.47 merges the image's patches in by the attention mask it is given.
    inputs["attention_mask"] = torch.ones_like(batch)
    if labels:
        inputs["labels"] = batch.masked_fill(batch == IMAGE_TOKEN_ID, -100)
    return inputs
