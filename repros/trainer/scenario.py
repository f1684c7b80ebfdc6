"""What a user asks the trainer for: engine, adapter, quantization, checkpointing, after-training steps.

Standard library only: a ``Scenario`` is plain data, read by the repros, the guards and the
fixed trainer in a cell, and written down in records.
"""

from __future__ import annotations

from dataclasses import dataclass

from repros.runtime.families import FAMILIES, Family, current_family

ENGINES = ("deepspeed", "fsdp2", "ddp", "fsdp1", "single")
#: FSDP1 auto-wrap policies: each decoder layer a unit (``transformer_auto_wrap_policy``), the
#: whole model one unit, or PEFT's ``fsdp_auto_wrap_policy`` (each LoRA layer a unit of its own).
FSDP1_WRAPS = ("layer", "none", "peft")
#: Who drives the training loop: the fixed trainer's own loop, or transformers' ``Trainer``.
TRAINER_LOOPS = ("own", "hf")
#: How a trained adapter is saved (see ``Scenario.save_method``).
SAVE_METHODS = ("default", "gathered")
#: The keys of a DeepSpeed config that HF's DeepSpeed guide sets to ``"auto"`` (filled from the
#: ``TrainingArguments``) and a user's config may leave out (see ``Scenario.ds_config_omits``).
DS_CONFIG_AUTO_KEYS = (
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "gradient_clipping",
    "scheduler.params.warmup_max_lr",
)


@dataclass(frozen=True)
class Scenario:
    #: ``deepspeed`` (ZeRO ``zero_stage``), ``fsdp2`` (torch ``fully_shard``), ``ddp``,
    #: ``fsdp1`` (torch ``FullyShardedDataParallel``), or ``single`` (one process, no wrapper).
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
    #: Enable checkpointing on the HF model before attaching the PEFT adapter (the usual recipe:
    #: ``get_peft_model`` then makes the embedding output require grad itself) rather than after.
    checkpointing_before_adapter: bool = False
    input_require_grads: bool = False
    #: FSDP2 only: also put the root module under the layers' mixed-precision policy.
    fsdp_root_mixed_precision: bool = False
    #: After training: ``none``, ``save-reload`` (save the adapter, load it into a fresh model),
    #: ``merge`` (merge it into the base) or ``sync`` (by name into an inference target),
    #: each checked by its logits (``repros/trainer/after_training.py``).
    after_training: str = "none"
    #: DDP only: ``find_unused_parameters``. HF Trainer passes True for a PEFT model under
    #: checkpointing (its "checkpointing: False" rule only looks at a ``PreTrainedModel``).
    ddp_find_unused_parameters: bool = False
    #: DDP only: ``static_graph=True``.
    ddp_static_graph: bool = False
    #: FSDP1 only: the auto-wrap policy (one of ``FSDP1_WRAPS``) and ``use_orig_params``
    #: (False is FSDP1's default).
    fsdp1_wrap: str = "layer"
    fsdp1_use_orig_params: bool = False
    #: ``own``: the fixed trainer's loop; ``hf``: transformers' ``Trainer`` with
    #: ``TrainingArguments(deepspeed=config)`` (DeepSpeed only).
    trainer_loop: str = "own"
    #: ZeRO-3: the model is partitioned as it loads (``from_pretrained`` inside ``deepspeed.zero.Init``):
    #: own loop, an ``HfDeepSpeedConfig`` is alive while it loads; ``hf``, it loads after the
    #: ``TrainingArguments`` exist (the usual order; False: before them, whole).
    zero_init: bool = False
    #: Add this many tokens with ``resize_token_embeddings`` before attaching the adapter (0: none),
    #: the vocabulary padded to a multiple of ``pad_to_multiple_of``.
    add_tokens: int = 0
    pad_to_multiple_of: int | None = None
    #: With tokens added: each row of the batch ends in the first new id (a padded batch holds the
    #: new pad token; a packed one, of full-length rows, holds none).
    batch_holds_added_token: bool = False
    #: PEFT ``modules_to_save``: modules trained in full and saved beside the adapters.
    modules_to_save: tuple[str, ...] = ()
    #: After training, save the adapter, load it back into a fresh base model and compare logits.
    save_adapter: bool = False
    #: ``default``: as the loop does it (``hf``: ``Trainer.save_model``; ``own``: rank 0 calls
    #: ``save_pretrained``); ``gathered``: every rank inside ``deepspeed.zero.GatheredParameters`` of
    #: the trainable parameters while rank 0 calls ``save_pretrained``.
    save_method: str = "default"
    #: DeepSpeed's ``stage3_gather_16bit_weights_on_model_save`` (what ``Trainer.save_model`` reads).
    zero3_gather_16bit_on_save: bool = False
    #: After training, sync the weights into an inference target (F4).
    sync_weights: bool = False
    merge_before_sync: bool = False
    #: ZeRO-3 only: DeepSpeed's ``stage3_param_persistence_threshold`` (``None``: its default,
    #: 1e5 elements, which keeps every parameter of a tiny model whole; 0 partitions them all).
    zero3_persistence_threshold: int | None = None
    #: ZeRO-3 only: DeepSpeed's ``sub_group_size`` (``None``: its default, 1e9 elements).
    zero3_sub_group_size: int | None = None
    bnb_no_repack: bool = False
    #: 4-bit only: bitsandbytes' ``bnb_4bit_quant_storage``, the dtype the packed weights are stored in
    #: (``None``: bitsandbytes' default, ``uint8``; ``bfloat16``: the compute dtype, as FSDP needs on torch
    #: before 2.12, F14).
    bnb_4bit_quant_storage: str | None = None
    #: ZeRO-3 only: wait on every async all-gather of a coalesced parameter gather, not only the
    #: last (``repros/trainer/zero3_gathers.py``; what DeepSpeed PR #8539 does from 0.19.8 on).
    zero3_wait_every_gather: bool = False
    #: ZeRO-3 only: DeepSpeed's ``stage3_allgather_sequential`` (gather parameters one at a time).
    zero3_allgather_sequential: bool = False
    #: ZeRO-3 only: a gather handle's second ``wait()`` does nothing (``repros/trainer/zero3_gathers.py``;
    #: what DeepSpeed PR #8487 does from 0.19.7 on).
    zero3_handles_wait_once: bool = False
    #: ZeRO-3 only: no model keeps transformers' shared ``rotary_fn`` child (the one ``nn.Module`` the
    #: ``kernels`` package makes of ``apply_rotary_pos_emb``; ``repros/trainer/kernel_funcs.py``; what
    #: transformers PR #45414 does from 5.5.4 on) (F18).
    zero3_no_kernel_func_children: bool = False
    #: HF loop only: the DeepSpeed config names a scheduler (``WarmupLR``, as HF's DeepSpeed guide does);
    #: False: none, so the Trainer builds its own (a ``LambdaLR`` over its optimizer's parameter groups) (F11).
    deepspeed_scheduler: bool = True
    #: HF loop only: the Trainer's optimizer keeps only its non-empty parameter groups (LoRA leaves the
    #: no-decay group empty), so a scheduler built on it agrees with what DeepSpeed keeps (F11).
    drop_empty_param_groups: bool = False
    #: The HF loop's ``TrainingArguments.gradient_accumulation_steps``; the own loop's DeepSpeed config's
    #: ``gradient_accumulation_steps`` (the engine steps the optimizer on every N-th ``step()``).
    gradient_accumulation_steps: int = 1
    #: The adapters' optimizer: ``adamw`` (torch's), ``sgd`` (torch's plain SGD) or ``adamw8bit`` (bitsandbytes').
    optimizer: str = "adamw"
    #: Micro-batches accumulated by hand per optimizer step: ``backward()`` called this many times before each
    #: ``step()``, DeepSpeed's ``gradient_accumulation_steps`` left as it is (F35).
    manual_accumulation: int = 1
    #: DeepSpeed with ``manual_accumulation``: tell the engine which ``backward()`` ends the step
    #: (``set_gradient_accumulation_boundary``), as it documents for such a loop (the F35 guard).
    deepspeed_accumulation_boundary: bool = False
    #: DeepSpeed accumulating by the engine: the loss divided by ``gradient_accumulation_steps`` by hand and
    #: ``backward(loss, scale_wrt_gas=False)``, as transformers' Trainer does (the F37 guard).
    deepspeed_scale_by_hand: bool = False
    #: The loss's gradient is not finite at this step (0-based), the loss itself finite: a masked term that
    #: ``torch.where`` selects away over ``log(0)`` (an RL loss's masked token), whose backward is NaN (F34).
    nonfinite_grad_at_step: int | None = None
    #: DeepSpeed's ``bf16.check_grad_overflow`` (``None``: the release's default; True from 0.19.3): a bf16 step
    #: whose gradient is not finite is skipped rather than applied.
    deepspeed_bf16_overflow_check: bool | None = None
    #: The trainer says every optimizer step the engine skipped (the F34 guard). A skipped step's gradient is
    #: left out of the training facts either way: it was never applied.
    say_skipped_steps: bool = False
    #: The seed the test model's random weights (and then the adapter's) are drawn from.
    seed: int = 0
    #: HF loop only: keys the user's DeepSpeed config leaves out of those HF's guide sets to ``"auto"``
    #: (``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps``, ``gradient_clipping``,
    #: ``scheduler.params.warmup_max_lr``): DeepSpeed's (or accelerate's) default then stands (F20).
    ds_config_omits: tuple[str, ...] = ()
    #: PEFT's ``autocast_adapter_dtype`` (``get_peft_model``'s default, True: adapter weights in float32 over a
    #: bf16 base; False: in the base model's dtype).
    peft_autocast_adapter_dtype: bool = True
    #: The base model: 0, the test model (a dense Qwen2); N, a mixture-of-experts model (Mixtral) with N
    #: experts per layer (``repros/trainer/tiny_models.py``).
    moe_experts: int = 0
    #: ZeRO-3 only: mark each mixture-of-experts block a leaf module (``deepspeed.utils.set_z3_leaf_modules``):
    #: its experts' parameters are gathered together, whichever experts a rank's tokens reach (F21).
    zero3_moe_leaf_modules: bool = False
    #: Load the base model from a checkpoint under accelerate's FSDP environment with
    #: ``fsdp_cpu_ram_efficient_loading`` (``repros/trainer/fsdp_loading.py``): transformers reads the
    #: weights on rank 0 only and gives the other ranks placeholders (F15).
    fsdp_cpu_ram_efficient_loading: bool = False
    #: FSDP2 only: after sharding, broadcast rank 0's full state dict into every rank's shards (what
    #: accelerate's ``fsdp2_load_full_state_dict`` does; the ``fsdp2-broadcast-rank0-weights`` guard).
    fsdp2_broadcast_from_rank0: bool = False
    #: FSDP2 only: after training, checkpoint the adapter as transformers' ``Trainer`` does under FSDP
    #: (accelerate's ``save_fsdp_model``, ``FULL_STATE_DICT``, ``adapter_only=True``) and check the file
    #: against the trained adapter (``repros/trainer/fsdp_adapter_save.py``; F16).
    fsdp2_trainer_adapter_checkpoint: bool = False
    #: With ``fsdp2_trainer_adapter_checkpoint``: gather the adapter's full tensors with torch's
    #: ``get_model_state_dict`` and write them on rank 0 instead (what accelerate does from 1.15.0; the
    #: ``fsdp2-adapter-full-state-dict`` guard).
    fsdp2_adapter_full_state_dict: bool = False
    #: FSDP2 only: shard through accelerate's ``fsdp2_prepare_model`` (what ``Accelerator.prepare`` does
    #: under an FSDP2 plugin: transformers' ``Trainer``, ``accelerate launch``) rather than the trainer's
    #: own ``fully_shard`` calls (``repros/trainer/fsdp2_accelerate.py``; F14).
    fsdp2_accelerate_prepare: bool = False
    #: PEFT's torchao dispatcher consulted only for a layer whose weight is a torchao tensor
    #: (``repros/trainer/torchao_dispatch.py``; what PEFT 0.19.0 does): before it, the dispatcher imports
    #: ``LinearActivationQuantizedTensor`` for every plain linear layer, a class torchao 0.18.0 removed (F30).
    peft_torchao_dispatch_checked: bool = False
    #: PEFT ``target_parameters``: LoRA on parameters by name (a mixture of experts' fused 3D expert weights,
    #: ``mlp.experts.gate_up_proj``), each wrapped by PEFT's ``ParamWrapper`` (F29).
    target_parameters: tuple[str, ...] = ()
    #: The base checkpoint is written in the layout published mixture-of-experts checkpoints keep (one tensor per
    #: expert and projection, ``block_sparse_moe.experts.N.w1``), which transformers 5 converts into its fused
    #: expert weights as it loads (``repros/trainer/moe_checkpoint.py``; F32).
    moe_checkpoint_per_expert: bool = False
    #: DeepSpeed only: train with Ulysses sequence parallelism (ALST) over every rank of the item
    #: (``repros/trainer/ulysses.py``: the degree is the world size) (F26, F27).
    sequence_parallel: bool = False
    #: With ``sequence_parallel``: hand ``register_with_transformers`` the transformers model inside the PEFT model
    #: rather than the PEFT model itself (the ``ulysses-register-base-model`` guard; what DeepSpeed PR #7737 accepts).
    ulysses_register_base_model: bool = False
    #: accelerate's FSDP2 context parallelism over every rank of the item (``ParallelismConfig(cp_size=world size)``,
    #: ``Accelerator.maybe_context_parallel``; ``repros/trainer/accelerate_cp.py``; CUDA only) (F28).
    context_parallel: bool = False
    #: With ``context_parallel``: clear the parallelism config's ``sp_backend`` (sequence parallelism is off) before
    #: ``prepare``, so accelerate 1.12's ``_prepare_cp`` does not skip building the context (the
    #: ``accelerate-cp-context`` guard; what accelerate PR #3858 does).
    accelerate_cp_clear_sp_backend: bool = False
    #: TRL's SFT ``loss_type="chunked_nll"``: the causal LM's forward patched by TRL's ``_patch_chunked_ce_lm_head``
    #: (the loss computed from the hidden states in chunks against ``lm_head.weight``, the logits never whole), as
    #: ``SFTTrainer`` patches it (``repros/trainer/trl_chunked_loss.py``) (F31).
    trl_chunked_nll: bool = False
    #: TRL's trainers only: ``use_liger_kernel`` (Liger's fused linear + loss kernels, Triton: CUDA only) (F25).
    liger_loss: bool = False
    lora_r: int = 8
    lora_alpha: int = 16
    #: PEFT's ``lora_dropout`` (the field's recipes use 0.05-0.1; 0: none, ``nn.Identity``).
    lora_dropout: float = 0.0
    #: DDP and FSDP2 only: ``torch.compile`` the wrapped model (inductor, the default backend) before
    #: training (F19).
    compile_model: bool = False
    target_modules: tuple[str, ...] = ("q_proj", "v_proj")
    #: The model family (``repros/runtime/families.py``); ``None``: the item's (``current_family()``, which the
    #: rank sets from the item's params). Set it to judge a scenario for another family (the guards' tests).
    family: str | None = None
    #: Resolve ``target_modules`` for the family (``repros/trainer/targets.py``: Phi-3's fused projections, a
    #: VLM's language model only) rather than use the names as written (the ``family-target-modules`` guard).
    family_targets: bool = False
    learning_rate: float = 1e-2
    #: ``None``: the model size's (``repros/trainer/tiny_models.py``).
    batch_size: int | None = None
    seq_len: int | None = None

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"unknown engine {self.engine!r}; known: {ENGINES}")
        if self.fsdp1_wrap not in FSDP1_WRAPS:
            raise ValueError(f"unknown fsdp1_wrap {self.fsdp1_wrap!r}; known: {FSDP1_WRAPS}")
        if self.trainer_loop not in TRAINER_LOOPS:
            raise ValueError(f"unknown trainer_loop {self.trainer_loop!r}; known: {TRAINER_LOOPS}")
        if self.trainer_loop == "hf" and self.engine != "deepspeed":
            raise ValueError("trainer_loop 'hf' drives DeepSpeed only")
        if self.save_method not in SAVE_METHODS:
            raise ValueError(f"unknown save_method {self.save_method!r}; known: {SAVE_METHODS}")
        if self.sequence_parallel and self.engine != "deepspeed":
            raise ValueError("sequence_parallel (Ulysses) trains on DeepSpeed only")
        if self.compile_model and self.engine not in ("ddp", "fsdp2"):
            raise ValueError("compile_model compiles a DDP or FSDP2 model only")
        if self.family is not None and self.family not in FAMILIES:
            raise ValueError(f"unknown family {self.family!r}; known: {', '.join(FAMILIES)}")
        unknown_keys = [k for k in self.ds_config_omits if k not in DS_CONFIG_AUTO_KEYS]
        if unknown_keys:
            raise ValueError(f"unknown ds_config_omits {unknown_keys}; known: {DS_CONFIG_AUTO_KEYS}")

    def packages(self) -> dict[str, str]:
        """The packages this scenario imports, beyond torch, each with what needs it: a cell without
        one cannot run the scenario (INFRA, ``repros/trainer/fixed_trainer.py``)."""
        needed = {"transformers": "the model"}
        if self.lora_impl == "peft":
            needed["peft"] = "the adapter"
        if self.engine == "deepspeed":
            needed["deepspeed"] = f"ZeRO-{self.zero_stage}"
        if self.quantization:
            needed["bitsandbytes"] = f"{self.quantization} quantization (QLoRA)"
        elif self.optimizer == "adamw8bit":
            needed["bitsandbytes"] = "its 8-bit AdamW"
        if self.trainer_loop == "hf":
            needed["accelerate"] = "transformers' Trainer"
        elif self.fsdp2_accelerate_prepare:
            needed["accelerate"] = "accelerate's FSDP2 preparation"
        elif self.fsdp_cpu_ram_efficient_loading:
            needed["accelerate"] = "accelerate's FSDP loading"
        return needed

    def model_family(self) -> Family:
        """The family this scenario trains: its own ``family``, else the item's."""
        return FAMILIES[self.family] if self.family is not None else current_family()
