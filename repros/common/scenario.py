"""What a user asks the trainer for: engine, adapter, quantization, checkpointing, after-training steps.

Standard library only: a ``Scenario`` is plain data, read by the repros, the guards and the
fixed trainer in a cell, and written down in records.
"""

from __future__ import annotations

from dataclasses import dataclass

ENGINES = ("deepspeed", "fsdp2", "ddp")


@dataclass(frozen=True)
class Scenario:
    #: ``deepspeed`` (ZeRO ``zero_stage``), ``fsdp2`` (torch ``fully_shard``) or ``ddp``.
    engine: str = "deepspeed"
    zero_stage: int = 3
    bf16: bool = True
    #: ``lora`` or ``dora`` (PEFT's ``use_dora``).
    adapter: str = "lora"
    #: ``peft``, or ``dschat``: DeepSpeed-Chat's own LoRA layers (``LinearLayer_LoRA``).
    lora_impl: str = "peft"
    #: How a PEFT adapter is attached: ``get_peft_model`` (a ``PeftModel``) or the HF
    #: model's own ``add_adapter`` (the model stays a raw HF model).
    peft_wrapping: str = "peft_model"
    #: ``None``, ``nf4`` (4-bit) or ``int8`` (8-bit), through bitsandbytes.
    quantization: str | None = None
    gradient_checkpointing: bool = True
    #: ``None``: call ``gradient_checkpointing_enable()`` with no arguments (the library's default).
    use_reentrant: bool | None = False
    use_cache: bool | None = None  # None: leave the model config's default
    input_require_grads: bool = False
    #: FSDP2 only: also put the root module under the layers' mixed-precision policy.
    fsdp_root_mixed_precision: bool = False
    #: After training: ``none``, ``save-reload`` (save the adapter, load it into a fresh model),
    #: ``merge`` (merge it into the base) or ``sync`` (by name into an inference target),
    #: each checked by its logits (``repros/common/after_training.py``).
    after_training: str = "none"
    #: After training, sync the weights into an inference target (F4).
    sync_weights: bool = False
    merge_before_sync: bool = False
    #: ZeRO-3 only: DeepSpeed's ``stage3_param_persistence_threshold`` (``None``: its default,
    #: 1e5 elements, which keeps every parameter of a tiny model whole; 0 partitions them all).
    zero3_persistence_threshold: int | None = None
    #: ZeRO-3 only: DeepSpeed's ``sub_group_size`` (``None``: its default, 1e9 elements).
    zero3_sub_group_size: int | None = None
    bnb_no_repack: bool = False
    lora_r: int = 8
    lora_alpha: int = 16
    target_modules: tuple[str, ...] = ("q_proj", "v_proj")
    learning_rate: float = 1e-2
    #: ``None``: the model size's (``repros/common/tiny_models.py``).
    batch_size: int | None = None
    seq_len: int | None = None

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"unknown engine {self.engine!r}; known: {ENGINES}")
