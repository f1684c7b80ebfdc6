"""The fixed trainer's workarounds, as one table: each guard's id, when it applies, what it
changes in the scenario, and why.

``choose_guards`` walks the table in order over the scenario as the guards before it left it
(so ``input-require-grads`` sees the reentrant checkpointing ``zero3-reentrant-checkpointing``
switched on) and the installed versions; ``apply_guards`` applies the chosen ones. A new guard
is one row here.

Guards (each recorded by id, with its reason, in the result):
- ``use-cache-off``: under gradient checkpointing, ``config.use_cache = False``.
- ``zero3-reentrant-checkpointing``: ZeRO-3 with frozen base weights and non-reentrant
  checkpointing on a DeepSpeed without PR #8148 re-partitions frozen weights to ``[0]``
  before torch checks the recompute (F1); checkpoint reentrantly instead.
- ``ddp-static-graph``: DDP with ``find_unused_parameters=True`` under reentrant
  checkpointing marks each checkpointed adapter ready once after the forward (unused: the
  checkpoint hides it) and again in the recompute's backward (F6); declare the graph static
  (``static_graph=True``), which keeps the user's checkpointing and unused-parameter search.
- ``input-require-grads``: under reentrant checkpointing with a frozen embedding no
  checkpointed block's input requires grad, so the adapters inside get none (F5); make the
  embedding output require grad (not when PEFT did so itself: checkpointing enabled before
  ``get_peft_model``).
- ``fsdp1-use-orig-params``: FSDP1 with ``use_orig_params=False`` flattens each unit's
  parameters into one and refuses frozen base weights and trainable adapters in one unit
  (F8); keep the original parameters (``use_orig_params=True``, torch PR #98221).
- ``fsdp-uniform-dtypes``: under FSDP mixed precision, float32 tensors entering a
  checkpointed, bf16 layer are recomputed in another dtype on torch without the recompute
  cast fix (F2); put the root module under the same mixed-precision policy as the layers.
- ``fsdp2-broadcast-rank0-weights``: under FSDP's ``cpu_ram_efficient_loading`` transformers
  loads the checkpoint on rank 0 only and leaves the other ranks placeholders (uninitialized
  memory on 4.x and 5.4-5.5, NaN among it: F15); after ``fully_shard``, broadcast rank 0's full
  state dict into every rank's shards (accelerate's ``fsdp2_load_full_state_dict``).
- ``fsdp2-adapter-full-state-dict``: accelerate before 1.15.0 checkpoints an FSDP2 adapter as
  transformers' ``Trainer`` asks (``FULL_STATE_DICT``, ``adapter_only=True``) from PEFT's state
  dict of DTensors, so rank 0 writes only its own shard of each tensor (F16, accelerate PR #4206);
  gather the full tensors with torch's ``get_model_state_dict`` and write them on rank 0.
- ``peft-model-wrap``: a quantized HF model with an adapter added by ``add_adapter`` goes to
  the engine as a raw HF model, whose ``.to`` transformers refuses (F3); wrap it in a
  ``PeftModel`` instead.
- ``lora-dropout-off-under-compile``: a compiled model (``torch.compile``, inductor) with LoRA dropout
  under activation checkpointing fails to compile on CUDA: Triton's MLIR pipeline rejects the kernel
  inductor makes of the dropout mask recomputed in the backward ("operand #0 does not dominate this
  use", ``InductorError: RuntimeError: PassManager::run failed``; F19, peft#3020); train the adapters
  without dropout. Its cost is regularization, not speed.
- ``bnb-4bit-storage-compute-dtype``: FSDP2 on torch before 2.12 makes every parameter it shards
  require grad before freezing it again, which bitsandbytes' 4-bit weights in their default ``uint8``
  storage refuse ("only Tensors of floating point dtype can require gradients"; F14, torch PR #177948;
  accelerate from 1.14.0, PR #3987, leaves them out of the sharding); store the 4-bit weights in the
  compute dtype (``bnb_4bit_quant_storage=torch.bfloat16``), as the QLoRA-with-FSDP recipes do.
- ``peft-torchao-dispatch-checked``: PEFT before 0.19.0 imports ``LinearActivationQuantizedTensor`` in LoRA's
  torchao dispatcher, which every plain linear layer reaches while torchao is installed; torchao 0.18.0
  removed the class, so 16-bit LoRA cannot be created (``ImportError``; QLoRA's layers match bitsandbytes'
  dispatcher first) (F30, PEFT PR #3140): consult that dispatcher only for a weight that is a torchao
  tensor. It costs nothing measurable.
- ``bnb-4bit-uint8-storage-fsdp2``: bitsandbytes packs two 4-bit indices a byte; stored in bfloat16 (the QLoRA-with-
  FSDP recipes' ``bnb_4bit_quant_storage``), about 0.1 % of the packed elements are bf16 NaN bit patterns, which
  FSDP2's parameter swap on CUDA rewrites to one canonical NaN, so the 4-bit weights decode to other values and
  the forward is silently wrong (F24, bitsandbytes#1945, open; a CPU copies them bit for bit): on torch >= 2.12,
  which shards uint8 (F14's fix), keep bitsandbytes' ``uint8`` storage. (On torch < 2.12 F14's guard must store
  them in bfloat16: on CUDA that meets this failure; no guard covers both there.)
- ``liger-loss-off-under-zero3``: TRL before 1.6.0 (GRPO; DPO and KTO before 1.9.0) passes Liger's fused linear
  loss ``unwrapped_model.lm_head.weight`` itself, outside the model's forward, so ZeRO-3's gather hook never fires
  and the kernel multiplies with an empty shard (``size mismatch, got input (...), vec (0)``; F25, TRL#3368/#4544,
  PR #5891): train without Liger's loss (the logits materialized whole: more activation memory).
- ``accelerate-cp-context``: accelerate 1.12.x's ``_prepare_cp`` returns early when the parallelism config's
  ``sp_backend`` is ``"deepspeed"``, its default even with no sequence parallelism, so FSDP2 context parallelism
  never builds ``_cp_context`` and ``maybe_context_parallel`` raises (F28, accelerate#3856/#3867, PR #3858):
  clear ``sp_backend`` before ``prepare``. Free.
- ``trl-nll-under-fsdp2-peft``: TRL 1.4.0 .. 1.6.x's SFT ``loss_type="chunked_nll"`` computes the loss from the
  hidden states and ``lm_head.weight`` in its own patched forward; under FSDP2 with a PEFT model ``lm_head`` is a
  sharded unit of its own that forward never enters, so its weight is still a ``DTensor`` beside plain hidden
  states (``aten.mm.default got mixed torch.Tensor and DTensor``; F31, TRL#6064/#4550, PR #6065): the plain
  ``nll`` loss (the logits materialized whole: more activation memory).
- ``bnb-cpu-no-repack``: bitsandbytes on an AVX512-BF16 CPU repacks 4-bit weights in place
  after an eval-mode forward, after which dequantize/merge return wrong weights; turn the
  repacking off on every ``Linear4bit``.
- ``merge-before-sync``: an inference engine's name-based loader rejects PEFT's parameter
  names (F4); merge the adapters into the base (dequantizing first when quantized), load
  strictly, and check the logits against the trained model.
- ``zero2-for-modules-to-save``: DeepSpeed 0.16.5 .. 0.19.2 cannot train PEFT ``modules_to_save``
  under ZeRO-3 at all ("'Linear' object has no attribute 'ds_grads_remaining'" in the first
  forward, F13, DeepSpeed#7203/#7615, fixed by PR #8144 in 0.19.3); use ZeRO-2, which keeps every
  parameter whole on every rank (more memory per rank).
- ``zero3-adapters-in-base-dtype``: DeepSpeed 0.19.2 no longer casts a model ZeRO-3 partitioned as it
  loaded (``zero.Init``) to bf16, so PEFT's float32 adapters sit beside the bf16 base among the
  persistent parameters, and the coalesced all-gather after the optimizer step allocates every output
  in the first one's dtype (F12, DeepSpeed#8072, fixed by PR #8073 in 0.19.3): create the adapters in
  the base model's dtype (``get_peft_model(..., autocast_adapter_dtype=False)``, TRL PR #6091).
- ``zero3-moe-leaf-modules``: under ZeRO-3 an MoE block whose experts are modules of their own
  (transformers 4.x) gathers only the experts its rank's tokens reach; ranks that route differently
  issue different all-gathers and hang (F21, DeepSpeed#4808); mark the MoE blocks leaf modules
  (``deepspeed.utils.set_z3_leaf_modules``), as DeepSpeed itself does for Mixtral and Qwen2/3-MoE from
  0.18.0 on (PR #7604). It applies to a Mixtral scenario (``moe_experts``) and to an item of an MoE
  family (Qwen2-MoE: its ``Qwen2MoeSparseMoeBlock`` is marked leaf).
- ``zero3-target-parameters-load-whole``: PEFT before 0.21.0 reads ``param.shape`` when LoRA's ``ParamWrapper``
  wraps a parameter named in ``target_parameters`` (a mixture of experts' fused expert weights); a model ZeRO-3
  partitioned as it loaded (``zero.Init``) has an empty shape there (``IndexError: tuple index out of range``,
  F29, peft#2916, PEFT PR #3576): load the model whole, attach the adapter, and let ``deepspeed.initialize``
  partition it (each rank holds the whole model while it loads).
- ``zero3-load-whole-then-partition``: transformers 5.0.0 .. 5.1.x load a checkpoint that needs transformers 5's
  weight conversion (a published Mixtral's per-expert layout) into a ``zero.Init`` model without converting it:
  5.0.0 leaves every weight at its random initialization (``MISSING`` rows in the load report, no error), 5.1.x
  raises "Failed to apply weight conversion" (F32, transformers#43940, PRs #43303 and #43964): load it whole
  (converted), and let ``deepspeed.initialize`` partition it (each rank holds the whole model while it loads).
- ``ulysses-register-base-model``: DeepSpeed 0.17.0 .. 0.18.3's ``UlyssesSPAttentionHF.register_with_transformers``
  takes its model argument for a model only when it is a ``PreTrainedModel``; a PEFT model (what accelerate's and
  transformers' ALST integration hand it) goes to ``AutoConfig.from_pretrained`` as a name (``TypeError: expected
  str, bytes or os.PathLike object, not PeftModel``; F26, DeepSpeed#7729, PR #7737): register the transformers
  model inside it (``get_base_model()``). Free.
- ``ulysses-zero1-not-zero0``: DeepSpeed 0.17.0 .. 0.18.1 with Ulysses and ZeRO stage 0 in bf16: the optimizer
  wrapper asks its mpu (Ulysses' ``parallel_state_sp``) for the deprecated ``get_model_parallel_rank`` (or
  ``_group``), which it does not have before PR #7649 (F27, DeepSpeed#7833): ZeRO stage 1, whose optimizer never
  asks (optimizer states partitioned: less memory per rank, a gather after each step).
- ``family-target-modules``: LoRA target names written for a Llama mean something else, or nothing, in
  another family: Phi-3 fuses query, key and value into ``qkv_proj`` and gate and up into
  ``gate_up_proj`` (PEFT raises only when no name matches; with ``o_proj``/``down_proj`` among them it
  silently adapts those alone), and a LLaVA's CLIP tower has ``q_proj``/``v_proj`` too, so the plain
  names put adapters on the frozen vision tower; resolve the names per family
  (``repros/trainer/targets.py``; F33's workaround, and for a LLaVA F23's). In every mode a list that
  partly matches (PEFT's silence) is an error (``TargetModulesMatchNothing``), never a LoRA on nothing;
  a list of which no name matches is PEFT's own refusal, as users meet it.
- ``zero3-wait-every-gather``: DeepSpeed before 0.19.8 waits only on the last of the async
  all-gathers of a coalesced ZeRO-3 parameter gather; on gloo they run unordered on threads of
  their own, so a parameter can be read before its gather arrived (F17, DeepSpeed PR #8539): wait
  on every handle. A hazard of CPU runs, not of a scenario: on a CPU it applies in every mode of
  every repro but F17's own (``hazard_guards``), so that no other repro's outcome depends on it.
- ``zero3-gather-handles-wait-once``: DeepSpeed before 0.19.7 with ``stage3_allgather_sequential``
  registers one gather handle under every parameter of a prefetch and waits it once per parameter;
  a late wait marks a parameter already released AVAILABLE, and the next forward multiplies with an
  empty weight (F22, DeepSpeed#8486): make a handle's second wait do nothing (PR #8487).
- ``zero3-no-shared-rotary-fn``: transformers 5.0 .. 5.5.3 with the ``kernels`` package wrap
  ``apply_rotary_pos_emb`` in one ``nn.Module`` and attach it to every attention module of every model
  as ``rotary_fn``; under ZeRO-3 a policy's and a reference model's engines (TRL's GRPO/RLOO with
  ``beta > 0``) both register that one module, and on DeepSpeed before its trace fixes the policy's
  trace pops an empty deque (F18, TRL#4899): leave the child out, as transformers PR #45414 (5.5.4)
  does under ZeRO-3.
- ``zero3-gathered-save``: under ZeRO-3 every rank holds a shard of each parameter; a save that
  does not gather them writes an empty adapter (transformers < 5's ``Trainer.save_model`` without
  ``stage3_gather_16bit_weights_on_model_save``) or ``[0]``-shaped tensors (``save_pretrained`` on
  rank 0) (F7), and peft 0.15.0 reads ``modules_to_save`` from the module itself even when handed
  a gathered state dict (F9); save inside ``deepspeed.zero.GatheredParameters`` of the trainable
  parameters instead.
- ``drop-empty-param-groups``: transformers before 5.1.0 builds the ``Trainer``'s own scheduler
  (none in the DeepSpeed config) on its optimizer's two parameter groups before DeepSpeed drops the
  empty no-decay group of a LoRA model; torch >= 2.10's strict ``zip`` in ``LRScheduler`` raises at
  step 1 (F11, transformers PR #43711): drop the empty groups before the scheduler is built.
- ``ds-config-auto``: a DeepSpeed config that leaves out a value the ``TrainingArguments`` set too
  (gradient accumulation, micro batch, clipping, the scheduler's peak learning rate) trains with
  DeepSpeed's or accelerate's default, and nothing says so (F20; an explicit conflicting value is
  refused by transformers): write every shared value as ``"auto"``.
- ``resize-before-zero3-init``: transformers 4.43.0 .. 4.43.3 resizes the token embeddings of a
  model ZeRO-3 partitioned as it loaded (``zero.Init``) into an embedding whose partitioned shape
  keeps the old vocabulary (and ``config.vocab_size`` 0 with ``pad_to_multiple_of``) (F10); load
  the model whole, resize, and let ``deepspeed.initialize`` partition it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from importlib import metadata
from typing import Any

from packaging.version import InvalidVersion, Version

from repros.runtime.registry import Registry
from repros.trainer.scenario import Scenario
from repros.trainer.targets import resolution_changes

#: First DeepSpeed release with PR #8148 ("Z3: Support for activation ckpt with
#: frozen params"). Established by running F1 (see repros/catalog/f1_zero3_frozen_ckpt.py).
DEEPSPEED_Z3_FROZEN_CKPT_FIX = Version("0.19.3")
#: First DeepSpeed release seen training PEFT modules_to_save under ZeRO-3 (0.18.0 and 0.19.2 fail
#: with DeepSpeed#7615's AttributeError). Established by running F9 (repros/catalog/f9_modules_to_save_zero3.py)
#: and bisected by F13 (repros/catalog/f13_zero3_modules_to_save_ds_grads_remaining.py).
DEEPSPEED_Z3_MODULES_TO_SAVE_FIX = Version("0.19.3")
#: First DeepSpeed release that fails to train modules_to_save under ZeRO-3 (PR #7062). Bisected by F13.
DEEPSPEED_Z3_MODULES_TO_SAVE_BROKEN = Version("0.16.5")
#: DeepSpeed releases whose ZeRO-3 coalesced gather allocates every output in the first parameter's
#: dtype while a zero.Init model keeps its float32 adapters (PR #8066 .. PR #8073). Bisected by F12
#: (repros/catalog/f12_zero3_mixed_dtype_gather.py).
DEEPSPEED_Z3_MIXED_DTYPE_GATHER_BROKEN = (Version("0.19.2"), Version("0.19.3"))
#: The first peft with ``get_peft_model(..., autocast_adapter_dtype=...)``.
PEFT_AUTOCAST_ADAPTER_DTYPE = Version("0.12.0")
#: First DeepSpeed release that makes Mixtral's and Qwen2/3-MoE's MoE blocks ZeRO-3 leaf modules by
#: default (PR #7604). Bisected by F21 (repros/catalog/f21_zero3_moe_routing_hang.py).
DEEPSPEED_Z3_MOE_DEFAULT_LEAF = Version("0.18.0")
#: transformers 5 keeps each MoE layer's experts in one module (fused 3D weights): gathered whole.
TRANSFORMERS_FUSED_EXPERTS = Version("5.0.0.dev0")
#: transformers 5 made non-reentrant checkpointing the default (4.x checkpointed reentrantly).
TRANSFORMERS_NON_REENTRANT_DEFAULT = Version("5.0.0.dev0")
#: transformers releases whose resize_token_embeddings breaks under zero.Init (F10: from PR #31979
#: to PR #32214). Established by running F10 (see repros/catalog/f10_resize_embeddings_zero3.py).
TRANSFORMERS_ZERO3_RESIZE_BROKEN = (Version("4.43.0"), Version("4.43.4"))
#: First DeepSpeed release whose coalesced ZeRO-3 gather waits on every handle (PR #8539).
#: Established by running F17 (see repros/catalog/f17_zero3_gloo_gather_race.py).
DEEPSPEED_Z3_GATHER_WAIT_FIX = Version("0.19.8")
#: First DeepSpeed release whose single-parameter gather handles wait once (PR #8487).
#: Established by running F22 (see repros/catalog/f22_zero3_sequential_handle_rewait.py).
DEEPSPEED_Z3_HANDLE_WAIT_ONCE_FIX = Version("0.19.7")
#: First transformers release that builds the Trainer's own scheduler after DeepSpeed has taken the
#: optimizer (PR #43711). Established by running F11 (see repros/catalog/f11_trainer_scheduler_param_groups.py).
TRANSFORMERS_SCHEDULER_AFTER_PREPARE = Version("5.1.0")
#: transformers 5.0 .. 5.5.3 attach one shared ``rotary_fn`` module to every attention module (with the
#: ``kernels`` package installed); PR #45414 (5.5.4) leaves it out under ZeRO-3 (F18, TRL#4899).
TRANSFORMERS_Z3_KERNEL_FUNC_CHILD = (Version("5.0.0.dev0"), Version("5.5.4"))
#: First accelerate release whose FSDP2 ``FULL_STATE_DICT`` adapter-only save gathers the adapter's full
#: tensors (PR #4206). Established by running F16 (see repros/catalog/f16_fsdp2_adapter_only_rank0_shard.py).
ACCELERATE_FSDP2_ADAPTER_FULL_SAVE = Version("1.15.0")
#: torch PR #177948 (2.12.0): FSDP2 builds a sharded parameter with the original's ``requires_grad``
#: instead of making it require grad first, so a frozen non-float (uint8 4-bit) parameter can be sharded.
TORCH_FSDP2_NONFLOAT_PARAMS = Version("2.12.0")
#: accelerate PR #3987 (1.14.0): ``fsdp2_prepare_model`` leaves non-float frozen ``Params4bit`` out of
#: ``fully_shard`` (its ``ignored_params``).
ACCELERATE_FSDP2_IGNORES_PARAMS4BIT = Version("1.14.0")

#: PEFT PR #3140 (0.19.0): LoRA's torchao dispatcher checks ``torchao.utils.TorchAOBaseTensor`` instead of
#: importing ``LinearActivationQuantizedTensor``. Bisected by F30 (repros/catalog/f30_peft_torchao_import.py).
PEFT_TORCHAO_BASE_TENSOR_DISPATCH = Version("0.19.0")
#: torchao 0.18.0 removed ``LinearActivationQuantizedTensor``. Bisected by F30.
TORCHAO_WITHOUT_LAQT = Version("0.18.0")

#: PEFT PR #3576 (0.21.0): LoRA's ``ParamWrapper`` (``target_parameters``) reads a ZeRO-3 partitioned parameter's
#: shape from ``ds_shape``. Bisected by F29 (repros/catalog/f29_zero3_target_parameters_shape.py).
PEFT_PARAM_WRAPPER_DS_SHAPE = Version("0.21.0")
#: transformers 5.0.0 loads a checkpoint that needs its weight conversion (a published MoE's per-expert layout)
#: into a ZeRO-3 partitioned model without converting it (PR #43303, 5.1.0, converts; its helper broke on the
#: converter's return shape until PR #43964, 5.2.0). Bisected by F32
#: (repros/catalog/f32_zero3_load_conversion_missing.py).
TRANSFORMERS_Z3_CONVERSION_BROKEN = (Version("5.0.0.dev0"), Version("5.2.0"))

#: DeepSpeed PR #7737 (0.18.4): ``register_with_transformers`` takes any model with a ``config`` (a PEFT model),
#: not only a ``PreTrainedModel``. Bisected by F26 (repros/catalog/f26_ulysses_peft_register.py).
DEEPSPEED_ULYSSES_REGISTERS_PEFT_MODEL = Version("0.18.4")
#: DeepSpeed PR #7649 (0.18.2): Ulysses' ``parallel_state_sp`` has ``get_model_parallel_rank``, which ZeRO stage 0's
#: bf16 optimizer asks of its mpu. Bisected by F27 (repros/catalog/f27_ulysses_zero0_mpu.py).
DEEPSPEED_ULYSSES_MPU_MODEL_PARALLEL_RANK = Version("0.18.2")

#: TRL PR #5891 (1.6.0): GRPO gathers ``lm_head`` under ZeRO-3 before Liger's fused loss reads it (DPO/KTO: PR #6372,
#: 1.9.0). Read from TRL's history; F25 needs CUDA (repros/catalog/f25_zero3_liger_lm_head_shard.py).
TRL_GRPO_LIGER_ZERO3_GATHER = Version("1.6.0")

#: accelerate PR #3817 (1.12.0) made ``_prepare_cp`` return early for ``sp_backend == "deepspeed"`` (the default);
#: PR #3858 (1.13.0) removed that check. Read from accelerate's history; F28 needs CUDA.
ACCELERATE_CP_SKIPPED = (Version("1.12.0"), Version("1.13.0"))

#: TRL releases whose SFT ``chunked_nll`` loss multiplies the hidden states by ``lm_head.weight`` still a sharded
#: DTensor under FSDP2 with a PEFT model: from 1.4.0 (PR #5575/#5676) to 1.7.0 (PR #6065). Bisected by F31
#: (repros/catalog/f31_fsdp2_peft_chunked_nll_dtensor.py).
TRL_CHUNKED_NLL_FSDP2_PEFT_BROKEN = (Version("1.4.0"), Version("1.7.0"))

#: DeepSpeed 0.19.3 made bf16's gradient-overflow check the default (PR #8035): a bf16 ZeRO step whose
#: gradient is not finite is skipped. 0.19.8 is the first release whose skip is logged (``LossScalerBase.
#: update_scale``, "OVERFLOW! Skipping step"); bisected by F34 (repros/catalog/f34_zero_bf16_silent_skipped_step.py).
DEEPSPEED_BF16_OVERFLOW_CHECK = Version("0.19.3")
DEEPSPEED_SKIPPED_STEP_LOGGED = Version("0.19.8")
#: ZeRO-2 keeps only the last micro-batch's gradient however it accumulates (DeepSpeed#7718, #7629), from 0.17.6
#: until 0.18.3 (bisected, F35's fixed mode).
DEEPSPEED_Z2_ACCUMULATION_BROKEN = (Version("0.17.6"), Version("0.18.3"))
#: The engine's output hooks (PR #7665, 0.18.3) divide by gradient_accumulation_steps once per output on the
#: loss's path until PR #8245 (0.19.6) marks the loss's graph as scaled (F37, bisected).
DEEPSPEED_OUTPUT_HOOKS_SCALE_TWICE = (Version("0.18.3"), Version("0.19.6"))
#: From 0.18.4 the hooks leave the gradient alone under ``backward(loss, scale_wrt_gas=False)`` (0.18.3 divides
#: whatever it says: no loop can undo it there).
DEEPSPEED_HOOKS_HONOUR_SCALE_WRT_GAS = Version("0.18.4")

#: Installed versions the guards look at: package name -> version (None: not installed).
Versions = Mapping[str, Version | None]
GUARDED_PACKAGES = ("deepspeed", "transformers", "torch", "peft", "bitsandbytes", "accelerate", "torchao", "trl")


@dataclass(frozen=True)
class Guard:
    """A guard as applied: its id and why it applied here."""

    id: str
    reason: str


@dataclass(frozen=True)
class GuardRule:
    """One workaround of the fixed trainer: its id, the documented failure it works around, when
    it applies (the scenario and the installed versions), the scenario fields it sets, and why."""

    id: str
    #: The documented failure it works around (a repro id), or "" for hygiene and for a failure no
    #: repro documents yet (its reason names the upstream report).
    works_around: str
    applies: Callable[[Scenario, Versions], bool]
    #: Scenario fields it sets.
    effect: Mapping[str, Any]
    reason: Callable[[Versions], str]
    #: A hazard of the machine the harness runs on rather than of the scenario (F17's gather race,
    #: on gloo only): guarded in every mode on a CPU, so that a ``bug`` run shows the repro's own
    #: failure and not this one, except in the repro that documents it (``hazard_guards``).
    every_mode: bool = False
    #: Other documented failures the same change works around (``family-target-modules``: F23's too).
    also_works_around: tuple[str, ...] = ()

    def works_around_failure(self, repro_id: str) -> bool:
        return repro_id == self.works_around or repro_id in self.also_works_around


def installed_versions(packages: tuple[str, ...] = GUARDED_PACKAGES) -> dict[str, Version | None]:
    found: dict[str, Version | None] = {}
    for name in packages:
        try:
            found[name] = Version(metadata.version(name))
        except (metadata.PackageNotFoundError, InvalidVersion):
            found[name] = None
    return found


def checkpoints_reentrantly(scenario: Scenario, versions: Versions | None = None) -> bool:
    """Whether the scenario's checkpointing is reentrant, the library default resolved."""
    if not scenario.gradient_checkpointing:
        return False
    if scenario.use_reentrant is not None:
        return scenario.use_reentrant
    transformers = (versions if versions is not None else installed_versions()).get("transformers")
    return transformers is None or transformers < TRANSFORMERS_NON_REENTRANT_DEFAULT


def _zero3_frozen_ckpt_affected(s: Scenario, v: Versions) -> bool:
    deepspeed = v.get("deepspeed")
    return (
        s.engine == "deepspeed"
        and s.zero_stage == 3
        and s.gradient_checkpointing
        and not checkpoints_reentrantly(s, v)
        and deepspeed is not None
        and deepspeed < DEEPSPEED_Z3_FROZEN_CKPT_FIX
    )


def _ddp_reentrant_unused_search(s: Scenario, v: Versions) -> bool:
    return (
        s.engine == "ddp" and s.ddp_find_unused_parameters and not s.ddp_static_graph and checkpoints_reentrantly(s, v)
    )


def _peft_makes_inputs_require_grad(s: Scenario) -> bool:
    """``get_peft_model`` on a model already checkpointing calls ``enable_input_require_grads``
    itself (unquantized models; PEFT's ``_prepare_model_for_gradient_checkpointing``)."""
    return (
        s.gradient_checkpointing
        and s.checkpointing_before_adapter
        and s.lora_impl == "peft"
        and s.peft_wrapping == "peft_model"
        and not s.quantization
    )


def _zero3_resize_affected(s: Scenario, v: Versions) -> bool:
    transformers = v.get("transformers")
    low, high = TRANSFORMERS_ZERO3_RESIZE_BROKEN
    return (
        s.engine == "deepspeed"
        and s.zero_stage == 3
        and s.zero_init
        and s.add_tokens > 0
        and transformers is not None
        and low <= transformers < high
    )


def _zero3_mixed_dtype_gather(s: Scenario, v: Versions) -> bool:
    deepspeed, peft = v.get("deepspeed"), v.get("peft")
    low, high = DEEPSPEED_Z3_MIXED_DTYPE_GATHER_BROKEN
    return (
        s.engine == "deepspeed"
        and s.zero_stage == 3
        and s.bf16
        and s.zero_init
        and s.lora_impl == "peft"
        and s.peft_wrapping == "peft_model"
        and not s.quantization
        and s.peft_autocast_adapter_dtype
        and deepspeed is not None
        and low <= deepspeed < high
        and peft is not None
        and peft >= PEFT_AUTOCAST_ADAPTER_DTYPE
    )


def _zero3_moe_routing_diverges(s: Scenario, v: Versions) -> bool:
    deepspeed, transformers = v.get("deepspeed"), v.get("transformers")
    return (
        s.engine == "deepspeed"
        and s.zero_stage == 3
        and (s.moe_experts > 0 or s.model_family().moe)
        and not s.zero3_moe_leaf_modules
        and deepspeed is not None
        and deepspeed < DEEPSPEED_Z3_MOE_DEFAULT_LEAF
        and transformers is not None
        and transformers < TRANSFORMERS_FUSED_EXPERTS
    )


def _fsdp2_shards_uint8_params4bit(s: Scenario, v: Versions) -> bool:
    """FSDP2 on torch before PR #177948 would be handed bitsandbytes' uint8 4-bit weights (F14)."""
    torch = v.get("torch")
    accelerate = v.get("accelerate")
    accelerate_ignores_them = (
        s.fsdp2_accelerate_prepare and accelerate is not None and accelerate >= ACCELERATE_FSDP2_IGNORES_PARAMS4BIT
    )
    return (
        s.engine == "fsdp2"
        and s.quantization == "nf4"
        and s.bnb_4bit_quant_storage in (None, "uint8")
        and torch is not None
        and torch < TORCH_FSDP2_NONFLOAT_PARAMS
        and not accelerate_ignores_them
    )


def _family_targets_unresolved(s: Scenario, v: Versions) -> bool:
    return not s.family_targets and resolution_changes(s.model_family(), s.target_modules)


def _zero3_gather_race(s: Scenario, v: Versions) -> bool:
    deepspeed = v.get("deepspeed")
    return (
        s.engine == "deepspeed"
        and s.zero_stage == 3
        and not s.zero3_wait_every_gather
        and deepspeed is not None
        and deepspeed < DEEPSPEED_Z3_GATHER_WAIT_FIX
    )


def _zero3_handle_rewait(s: Scenario, v: Versions) -> bool:
    deepspeed = v.get("deepspeed")
    return (
        s.engine == "deepspeed"
        and s.zero_stage == 3
        and s.zero3_allgather_sequential
        and not s.zero3_handles_wait_once
        and deepspeed is not None
        and deepspeed < DEEPSPEED_Z3_HANDLE_WAIT_ONCE_FIX
    )


def _zero3_shared_kernel_func(s: Scenario, v: Versions) -> bool:
    transformers = v.get("transformers")
    low, high = TRANSFORMERS_Z3_KERNEL_FUNC_CHILD
    return (
        s.engine == "deepspeed"
        and s.zero_stage == 3
        and not s.zero3_no_kernel_func_children
        and transformers is not None
        and low <= transformers < high
    )


def _peft_torchao_dispatch_imports_removed_class(s: Scenario, v: Versions) -> bool:
    peft, torchao = v.get("peft"), v.get("torchao")
    return (
        s.lora_impl == "peft"
        and not s.peft_torchao_dispatch_checked
        and peft is not None
        and peft < PEFT_TORCHAO_BASE_TENSOR_DISPATCH
        and torchao is not None
        and torchao >= TORCHAO_WITHOUT_LAQT
    )


def _zero3_param_wrapper_empty_shape(s: Scenario, v: Versions) -> bool:
    peft = v.get("peft")
    return (
        s.engine == "deepspeed"
        and s.zero_stage == 3
        and s.zero_init
        and bool(s.target_parameters)
        and peft is not None
        and peft < PEFT_PARAM_WRAPPER_DS_SHAPE
    )


def _zero3_load_skips_conversion(s: Scenario, v: Versions) -> bool:
    transformers = v.get("transformers")
    low, high = TRANSFORMERS_Z3_CONVERSION_BROKEN
    return (
        s.engine == "deepspeed"
        and s.zero_stage == 3
        and s.zero_init
        and s.moe_checkpoint_per_expert
        and transformers is not None
        and low <= transformers < high
    )


def _ulysses_registers_peft_model(s: Scenario, v: Versions) -> bool:
    deepspeed = v.get("deepspeed")
    return (
        s.sequence_parallel
        and s.lora_impl == "peft"
        and s.peft_wrapping == "peft_model"
        and not s.ulysses_register_base_model
        and deepspeed is not None
        and deepspeed < DEEPSPEED_ULYSSES_REGISTERS_PEFT_MODEL
    )


def _ulysses_zero0_bf16_asks_model_parallel_rank(s: Scenario, v: Versions) -> bool:
    deepspeed = v.get("deepspeed")
    return (
        s.sequence_parallel
        and s.zero_stage == 0
        and s.bf16
        and deepspeed is not None
        and deepspeed < DEEPSPEED_ULYSSES_MPU_MODEL_PARALLEL_RANK
    )


def _fsdp2_4bit_float_storage(s: Scenario, v: Versions) -> bool:
    """FSDP2 on a torch that can shard uint8 (>= 2.12) handed 4-bit weights packed in bfloat16 (F24)."""
    torch = v.get("torch")
    return (
        s.engine == "fsdp2"
        and s.quantization == "nf4"
        and s.bnb_4bit_quant_storage not in (None, "uint8")
        and torch is not None
        and torch >= TORCH_FSDP2_NONFLOAT_PARAMS
    )


#: The built-in guards, in the order they are chosen (one guard's effect can make the next apply).
_BUILT_IN: tuple[GuardRule, ...] = (
    GuardRule(
        "use-cache-off",
        "",
        lambda s, v: s.gradient_checkpointing and s.use_cache is not False,
        {"use_cache": False},
        lambda v: "KV cache is useless and harmful under gradient checkpointing",
    ),
    GuardRule(
        "zero3-reentrant-checkpointing",
        "F1",
        _zero3_frozen_ckpt_affected,
        {"use_reentrant": True},
        lambda v: (
            f"deepspeed {v.get('deepspeed')} < {DEEPSPEED_Z3_FROZEN_CKPT_FIX} re-partitions frozen weights "
            "during non-reentrant recompute (F1, DeepSpeed PR #8148)"
        ),
    ),
    GuardRule(
        "ddp-static-graph",
        "F6",
        _ddp_reentrant_unused_search,
        {"ddp_static_graph": True},
        lambda v: "DDP's unused-parameter search marks adapters under reentrant checkpointing ready twice (F6)",
    ),
    GuardRule(
        "input-require-grads",
        "F5",
        lambda s, v: (
            s.gradient_checkpointing
            and checkpoints_reentrantly(s, v)
            and not s.input_require_grads
            and not _peft_makes_inputs_require_grad(s)
        ),
        {"input_require_grads": True},
        lambda v: "reentrant checkpointing with a frozen embedding gives adapters no gradient (F5)",
    ),
    GuardRule(
        "fsdp1-use-orig-params",
        "F8",
        lambda s, v: s.engine == "fsdp1" and not s.fsdp1_use_orig_params and s.fsdp1_wrap != "peft",
        {"fsdp1_use_orig_params": True},
        lambda v: "FSDP1 without use_orig_params refuses frozen and trainable parameters in one unit (F8)",
    ),
    GuardRule(
        "fsdp-uniform-dtypes",
        "F2",
        lambda s, v: s.engine == "fsdp2" and s.bf16 and not s.fsdp_root_mixed_precision,
        {"fsdp_root_mixed_precision": True},
        lambda v: "float32 tensors entering a checkpointed bf16 FSDP layer may be recomputed in another dtype (F2)",
    ),
    GuardRule(
        "fsdp2-broadcast-rank0-weights",
        "F15",
        lambda s, v: s.engine == "fsdp2" and s.fsdp_cpu_ram_efficient_loading and not s.fsdp2_broadcast_from_rank0,
        {"fsdp2_broadcast_from_rank0": True},
        lambda v: (
            f"transformers {v.get('transformers')} loads a cpu_ram_efficient_loading checkpoint on rank 0 only; the "
            "other ranks hold placeholders (uninitialized memory, NaN, on 4.x and 5.4-5.5: F15) until rank 0 "
            "broadcasts: broadcast after sharding, as accelerate's fsdp2_load_full_state_dict does"
        ),
    ),
    GuardRule(
        "fsdp2-adapter-full-state-dict",
        "F16",
        lambda s, v: (
            s.engine == "fsdp2"
            and s.fsdp2_trainer_adapter_checkpoint
            and not s.fsdp2_adapter_full_state_dict
            and (accelerate := v.get("accelerate")) is not None
            and accelerate < ACCELERATE_FSDP2_ADAPTER_FULL_SAVE
        ),
        {"fsdp2_adapter_full_state_dict": True},
        lambda v: (
            f"accelerate {v.get('accelerate')} < {ACCELERATE_FSDP2_ADAPTER_FULL_SAVE} saves an FSDP2 adapter "
            "(FULL_STATE_DICT, adapter_only) from PEFT's DTensors: rank 0's shard only (F16, accelerate PR #4206)"
        ),
    ),
    GuardRule(
        "peft-model-wrap",
        "F3",
        lambda s, v: bool(s.quantization) and s.peft_wrapping != "peft_model",
        {"peft_wrapping": "peft_model"},
        lambda v: "engines call .to on a raw HF model, which transformers refuses when quantized (F3)",
    ),
    GuardRule(
        "lora-dropout-off-under-compile",
        "F19",
        lambda s, v: s.compile_model and s.gradient_checkpointing and s.lora_dropout > 0,
        {"lora_dropout": 0.0},
        lambda v: (
            f"torch {v.get('torch')}: inductor's Triton pipeline fails on a LoRA dropout recomputed under "
            "checkpointing in a compiled model ('PassManager::run failed', F19, peft#3020; no fix released): train "
            "the adapters without dropout (lora_dropout=0: less regularization)"
        ),
    ),
    GuardRule(
        "bnb-4bit-storage-compute-dtype",
        "F14",
        _fsdp2_shards_uint8_params4bit,
        {"bnb_4bit_quant_storage": "bfloat16"},
        lambda v: (
            f"torch {v.get('torch')} < {TORCH_FSDP2_NONFLOAT_PARAMS} cannot shard bitsandbytes' uint8 4-bit weights "
            "with FSDP2 ('only Tensors of floating point dtype can require gradients', F14, torch PR #177948, "
            "accelerate PR #3987): store them in the compute dtype (bnb_4bit_quant_storage=bfloat16)"
        ),
    ),
    GuardRule(
        "peft-torchao-dispatch-checked",
        "F30",
        _peft_torchao_dispatch_imports_removed_class,
        {"peft_torchao_dispatch_checked": True},
        lambda v: (
            f"peft {v.get('peft')} < {PEFT_TORCHAO_BASE_TENSOR_DISPATCH} imports LinearActivationQuantizedTensor in "
            f"its torchao dispatcher for every plain linear layer, and torchao {v.get('torchao')} no longer has it "
            "(F30, PEFT PR #3140): consult that dispatcher only for torchao weights, as PEFT 0.19.0 does"
        ),
    ),
    GuardRule(
        "bnb-4bit-uint8-storage-fsdp2",
        "F24",
        _fsdp2_4bit_float_storage,
        {"bnb_4bit_quant_storage": "uint8"},
        lambda v: (
            f"FSDP2 on CUDA rewrites every bf16 NaN bit pattern its parameter swap copies, and 4-bit weights packed "
            f"in bfloat16 hold some: the forward silently changes (F24, bitsandbytes#1945, open); torch "
            f"{v.get('torch')} >= {TORCH_FSDP2_NONFLOAT_PARAMS} shards uint8 storage, which no float path touches"
        ),
    ),
    GuardRule(
        "liger-loss-off-under-zero3",
        "F25",
        lambda s, v: (
            s.liger_loss
            and s.engine == "deepspeed"
            and s.zero_stage == 3
            and (trl := v.get("trl")) is not None
            and trl < TRL_GRPO_LIGER_ZERO3_GATHER
        ),
        {"liger_loss": False},
        lambda v: (
            f"trl {v.get('trl')} < {TRL_GRPO_LIGER_ZERO3_GATHER} hands Liger's fused loss lm_head.weight as ZeRO-3 "
            "left "
            "it (an empty shard: 'size mismatch ... vec (0)', F25, TRL#3368, PR #5891): train GRPO without Liger's "
            "loss (the full logits are materialized: more activation memory)"
        ),
    ),
    GuardRule(
        "accelerate-cp-context",
        "F28",
        lambda s, v: (
            s.context_parallel
            and not s.accelerate_cp_clear_sp_backend
            and (accelerate := v.get("accelerate")) is not None
            and ACCELERATE_CP_SKIPPED[0] <= accelerate < ACCELERATE_CP_SKIPPED[1]
        ),
        {"accelerate_cp_clear_sp_backend": True},
        lambda v: (
            f"accelerate {v.get('accelerate')} skips building the context-parallel context when sp_backend is "
            "'deepspeed', its default ('Accelerator' object has no attribute '_cp_context', F28, accelerate#3856, "
            "PR #3858): clear sp_backend before prepare (no sequence parallelism is configured)"
        ),
    ),
    GuardRule(
        "trl-nll-under-fsdp2-peft",
        "F31",
        lambda s, v: (
            s.trl_chunked_nll
            and s.engine == "fsdp2"
            and s.lora_impl == "peft"
            and (trl := v.get("trl")) is not None
            and TRL_CHUNKED_NLL_FSDP2_PEFT_BROKEN[0] <= trl < TRL_CHUNKED_NLL_FSDP2_PEFT_BROKEN[1]
        ),
        {"trl_chunked_nll": False},
        lambda v: (
            f"trl {v.get('trl')} (< {TRL_CHUNKED_NLL_FSDP2_PEFT_BROKEN[1]}): SFT's chunked_nll under FSDP2 with a PEFT "
            "model multiplies plain hidden states by lm_head.weight still a sharded DTensor ('aten.mm.default got "
            "mixed torch.Tensor and DTensor', F31, TRL#6064, PR #6065): loss_type='nll' (the logits materialized "
            "whole: more activation memory)"
        ),
    ),
    GuardRule(
        "bnb-cpu-no-repack",
        "",
        lambda s, v: s.quantization == "nf4" and not s.bnb_no_repack,
        {"bnb_no_repack": True},
        lambda v: "bitsandbytes' CPU repacking of 4-bit weights corrupts dequantize/merge",
    ),
    GuardRule(
        "resize-before-zero3-init",
        "F10",
        _zero3_resize_affected,
        {"zero_init": False},
        lambda v: (
            f"transformers {v.get('transformers')} resizes embeddings partitioned by zero.Init to a stale "
            "shape (F10, transformers PR #32214)"
        ),
    ),
    GuardRule(
        "zero2-for-modules-to-save",
        "F13",
        lambda s, v: (
            s.engine == "deepspeed"
            and s.zero_stage == 3
            and bool(s.modules_to_save)
            and (deepspeed := v.get("deepspeed")) is not None
            and DEEPSPEED_Z3_MODULES_TO_SAVE_BROKEN <= deepspeed < DEEPSPEED_Z3_MODULES_TO_SAVE_FIX
        ),
        {"zero_stage": 2},
        lambda v: (
            f"deepspeed {v.get('deepspeed')} (>= {DEEPSPEED_Z3_MODULES_TO_SAVE_BROKEN}, "
            f"< {DEEPSPEED_Z3_MODULES_TO_SAVE_FIX}) cannot train modules_to_save under ZeRO-3 "
            "('ds_grads_remaining', F13, DeepSpeed#7615)"
        ),
    ),
    GuardRule(
        "zero3-adapters-in-base-dtype",
        "F12",
        _zero3_mixed_dtype_gather,
        {"peft_autocast_adapter_dtype": False},
        lambda v: (
            f"deepspeed {v.get('deepspeed')} gathers ZeRO-3 persistent parameters into buffers of the first one's "
            "dtype, and keeps a zero.Init model's float32 adapters beside its bf16 base (F12, DeepSpeed#8072)"
        ),
    ),
    GuardRule(
        "zero3-target-parameters-load-whole",
        "F29",
        _zero3_param_wrapper_empty_shape,
        {"zero_init": False},
        lambda v: (
            f"peft {v.get('peft')} < {PEFT_PARAM_WRAPPER_DS_SHAPE} reads a ZeRO-3 partitioned parameter's shape "
            "(empty) when it wraps it for target_parameters ('tuple index out of range', F29, PEFT PR #3576): load "
            "the model whole, attach the adapter, and let deepspeed.initialize partition it"
        ),
    ),
    GuardRule(
        "zero3-load-whole-then-partition",
        "F32",
        _zero3_load_skips_conversion,
        {"zero_init": False},
        lambda v: (
            f"transformers {v.get('transformers')} (>= 5.0, < {TRANSFORMERS_Z3_CONVERSION_BROKEN[1]}) loads a "
            "checkpoint that needs its weight conversion (a published MoE's per-expert layout) into a zero.Init "
            "model unconverted: the weights stay random (MISSING) or the conversion raises (F32, transformers "
            "PR #43303, #43964): load it whole, converted, and let deepspeed.initialize partition it"
        ),
    ),
    GuardRule(
        "ulysses-register-base-model",
        "F26",
        _ulysses_registers_peft_model,
        {"ulysses_register_base_model": True},
        lambda v: (
            f"deepspeed {v.get('deepspeed')} < {DEEPSPEED_ULYSSES_REGISTERS_PEFT_MODEL}: Ulysses' "
            "register_with_transformers "
            "takes a model that is not a PreTrainedModel (a PEFT model) for a name and hands it to AutoConfig (F26, "
            "DeepSpeed#7729, PR #7737): register the transformers model inside it"
        ),
    ),
    GuardRule(
        "ulysses-zero1-not-zero0",
        "F27",
        _ulysses_zero0_bf16_asks_model_parallel_rank,
        {"zero_stage": 1},
        lambda v: (
            f"deepspeed {v.get('deepspeed')} < {DEEPSPEED_ULYSSES_MPU_MODEL_PARALLEL_RANK}: ZeRO stage 0's bf16 "
            "optimizer asks the Ulysses mpu for get_model_parallel_rank/_group, which it lacks (F27, DeepSpeed#7833, "
            "PR "
            "#7649): ZeRO stage 1 (its optimizer never asks; optimizer states partitioned across the ranks)"
        ),
    ),
    GuardRule(
        "zero3-moe-leaf-modules",
        "F21",
        _zero3_moe_routing_diverges,
        {"zero3_moe_leaf_modules": True},
        lambda v: (
            f"deepspeed {v.get('deepspeed')} < {DEEPSPEED_Z3_MOE_DEFAULT_LEAF} with transformers "
            f"{v.get('transformers')} gathers only the experts a rank's tokens reach: ranks that route "
            "differently hang (F21, DeepSpeed#4808)"
        ),
    ),
    GuardRule(
        "family-target-modules",
        "F33",
        _family_targets_unresolved,
        {"family_targets": True},
        lambda v: (
            "LoRA target names written for a Llama miss or over-reach in this family (Phi-3's fused qkv_proj and "
            "gate_up_proj; a VLM's CLIP tower has q_proj/v_proj too): resolved per family (F33, F23)"
        ),
        also_works_around=("F23",),
    ),
    GuardRule(
        "zero3-wait-every-gather",
        "F17",
        _zero3_gather_race,
        {"zero3_wait_every_gather": True},
        lambda v: (
            f"deepspeed {v.get('deepspeed')} < {DEEPSPEED_Z3_GATHER_WAIT_FIX} waits only on the last all-gather of "
            "a coalesced ZeRO-3 gather; on gloo the others may not have arrived (F17, DeepSpeed PR #8539)"
        ),
        every_mode=True,
    ),
    GuardRule(
        "zero3-no-shared-rotary-fn",
        "F18",
        _zero3_shared_kernel_func,
        {"zero3_no_kernel_func_children": True},
        lambda v: (
            f"transformers {v.get('transformers')} (< {TRANSFORMERS_Z3_KERNEL_FUNC_CHILD[1]}) gives every model's "
            "attention one shared rotary_fn module; a policy's and a reference model's ZeRO-3 engines both "
            "register it and a trace breaks ('pop from an empty deque', F18, TRL#4899, transformers PR #45414)"
        ),
    ),
    GuardRule(
        "zero3-gather-handles-wait-once",
        "F22",
        _zero3_handle_rewait,
        {"zero3_handles_wait_once": True},
        lambda v: (
            f"deepspeed {v.get('deepspeed')} < {DEEPSPEED_Z3_HANDLE_WAIT_ONCE_FIX} with sequential ZeRO-3 gathers "
            "waits a handle once per parameter and marks released ones available (F22, DeepSpeed#8486)"
        ),
    ),
    GuardRule(
        "zero3-gathered-save",
        "F7",
        lambda s, v: s.save_adapter and s.engine == "deepspeed" and s.zero_stage == 3 and s.save_method != "gathered",
        {"save_method": "gathered"},
        lambda v: (
            "a ZeRO-3 save that does not gather the parameters writes empty or [0]-shaped adapters (F7; "
            "peft 0.15.0's modules_to_save, F9)"
        ),
    ),
    GuardRule(
        "drop-empty-param-groups",
        "F11",
        lambda s, v: (
            s.engine == "deepspeed"
            and s.trainer_loop == "hf"
            and not s.deepspeed_scheduler
            and not s.drop_empty_param_groups
            and (transformers := v.get("transformers")) is not None
            and transformers < TRANSFORMERS_SCHEDULER_AFTER_PREPARE
        ),
        {"drop_empty_param_groups": True},
        lambda v: (
            f"transformers {v.get('transformers')} < {TRANSFORMERS_SCHEDULER_AFTER_PREPARE} builds its scheduler "
            "before DeepSpeed drops the empty no-decay group of a LoRA model; torch >= 2.10's strict zip then "
            "raises (F11, transformers PR #43711)"
        ),
    ),
    GuardRule(
        "ds-config-auto",
        "F20",
        lambda s, v: s.engine == "deepspeed" and s.trainer_loop == "hf" and bool(s.ds_config_omits),
        {"ds_config_omits": ()},
        lambda v: (
            "a DeepSpeed config that leaves out a value the TrainingArguments also set trains with DeepSpeed's "
            "default, silently (F20); write every shared value as 'auto'"
        ),
    ),
    GuardRule(
        "say-skipped-steps",
        "F34",
        lambda s, v: (
            s.engine == "deepspeed"
            and s.bf16
            and s.zero_stage >= 1
            and not s.say_skipped_steps
            and (deepspeed := v.get("deepspeed")) is not None
            and deepspeed < DEEPSPEED_SKIPPED_STEP_LOGGED
        ),
        {"say_skipped_steps": True, "deepspeed_bf16_overflow_check": True},
        lambda v: (
            f"deepspeed {v.get('deepspeed')} (< {DEEPSPEED_SKIPPED_STEP_LOGGED}) says nothing when a bf16 ZeRO step "
            "is skipped for a non-finite gradient (from 0.19.3, PR #8035), or applies it unchecked (before): check for "
            "overflow and say every skipped step (F34, DeepSpeed#8415)"
        ),
    ),
    GuardRule(
        "zero1-accumulation-before-0.18.3",
        "F35",
        lambda s, v: (
            s.engine == "deepspeed"
            and s.zero_stage == 2
            and (s.manual_accumulation > 1 or s.gradient_accumulation_steps > 1)
            and (deepspeed := v.get("deepspeed")) is not None
            and DEEPSPEED_Z2_ACCUMULATION_BROKEN[0] <= deepspeed < DEEPSPEED_Z2_ACCUMULATION_BROKEN[1]
        ),
        {"zero_stage": 1},
        lambda v: (
            f"deepspeed {v.get('deepspeed')} (>= {DEEPSPEED_Z2_ACCUMULATION_BROKEN[0]}, < "
            f"{DEEPSPEED_Z2_ACCUMULATION_BROKEN[1]}): ZeRO-2 applies only the last micro-batch's gradient however it "
            "accumulates, the boundary said or not (F35, DeepSpeed#7718): ZeRO-1 instead, which accumulates "
            "correctly there (the gradients are kept whole on every rank: more memory)"
        ),
    ),
    GuardRule(
        "deepspeed-accumulation-boundary",
        "F35",
        lambda s, v: (
            s.engine == "deepspeed"
            and s.zero_stage in (1, 2)
            and s.manual_accumulation > 1
            and s.gradient_accumulation_steps == 1
            and not s.deepspeed_accumulation_boundary
        ),
        {"deepspeed_accumulation_boundary": True},
        lambda v: (
            "ZeRO-1/2 with gradient_accumulation_steps 1 takes every backward() as the step's boundary and resets "
            "its gradient accumulator there, so only the last micro-batch of a step is applied (F35, open-instruct "
            "PR #1498): set_gradient_accumulation_boundary(False) before each backward but the last"
        ),
    ),
    GuardRule(
        "deepspeed-scale-by-hand",
        "F37",
        lambda s, v: (
            s.engine == "deepspeed"
            and s.trainer_loop == "own"
            and s.gradient_accumulation_steps > 1
            and not s.deepspeed_scale_by_hand
            and (deepspeed := v.get("deepspeed")) is not None
            and DEEPSPEED_HOOKS_HONOUR_SCALE_WRT_GAS <= deepspeed < DEEPSPEED_OUTPUT_HOOKS_SCALE_TWICE[1]
        ),
        {"deepspeed_scale_by_hand": True},
        lambda v: (
            f"deepspeed {v.get('deepspeed')} (>= {DEEPSPEED_OUTPUT_HOOKS_SCALE_TWICE[0]}, < "
            f"{DEEPSPEED_OUTPUT_HOOKS_SCALE_TWICE[1]}) divides the gradient by gradient_accumulation_steps once for "
            "every output of the engine on the loss's path (the loss and the logits it came from), so the model "
            "trains on a gradient that many times too small (F37, DeepSpeed PR #7665, fixed by PR #8245): the loss "
            "divided by hand and backward(loss, scale_wrt_gas=False), as transformers' Trainer does"
        ),
    ),
    GuardRule(
        "fp32-state-under-sharding",
        "F36",
        lambda s, v: (
            s.optimizer == "adamw8bit"
            and ((s.engine == "deepspeed" and s.zero_stage >= 1) or s.engine in ("fsdp1", "fsdp2"))
        ),
        {"optimizer": "adamw"},
        lambda v: (
            "an 8-bit optimizer decides and quantizes its state per tensor it is given: under ZeRO's flattened "
            "partitions or FSDP's shards that is a shard, not a parameter, so a parameter gets 8-bit state where one "
            "process gives it float32 (bitsandbytes#2080, torchao#4912; F36): keep float32 state (torch's AdamW)"
        ),
    ),
    GuardRule(
        "merge-before-sync",
        "F4",
        lambda s, v: s.sync_weights and not s.merge_before_sync,
        {"merge_before_sync": True},
        lambda v: "inference loaders reject PEFT parameter names; merge, load strictly, check (F4)",
    ),
)
#: Every guard, by id, in order (``repros/runtime/registry.py``).
GUARDS: Registry[GuardRule] = Registry("guard of the fixed trainer", {rule.id: rule for rule in _BUILT_IN})


def choose_guards(scenario: Scenario, versions: Versions | None = None) -> list[Guard]:
    """The guards that apply to ``scenario`` with ``versions`` (default: what is installed)."""
    versions = versions if versions is not None else installed_versions()
    chosen: list[Guard] = []
    current = scenario
    for rule in GUARDS.values():
        if rule.applies(current, versions):
            chosen.append(Guard(rule.id, rule.reason(versions)))
            current = replace(current, **rule.effect)
    return chosen


def hazard_guards(
    scenario: Scenario, device_type: str, documented: str, versions: Versions | None = None
) -> list[Guard]:
    """The guards a run as users wrote it still gets: those of the CPU machine's own hazards
    (``every_mode``), on a CPU, except for the repro ``documented`` that is about that hazard."""
    if device_type != "cpu":
        return []
    versions = versions if versions is not None else installed_versions()
    return [
        Guard(rule.id, rule.reason(versions))
        for rule in GUARDS.values()
        if rule.every_mode and rule.works_around != documented and rule.applies(scenario, versions)
    ]


def apply_guards(scenario: Scenario, guards: list[Guard]) -> Scenario:
    changes: dict[str, Any] = {}
    for guard in guards:
        changes.update(GUARDS[guard.id].effect)
    return replace(scenario, **changes)
