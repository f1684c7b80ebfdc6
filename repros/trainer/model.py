"""The model a scenario trains: the test model with its adapters attached and checkpointing set as
the scenario says, the batch each rank trains on, what a failure's signature may need to know
about the run (``scenario_facts``), and what training leaves behind (``Trained``)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from repros.trainer.guards import checkpoints_reentrantly
from repros.trainer.scenario import Scenario
from repros.trainer.targets import resolve_targets
from repros.trainer.tiny_models import VOCAB_SIZE, fixed_batch, tiny_qwen2


def build_model(scenario: Scenario, base: Any = None) -> Any:
    """The tiny base model (or ``base``, already loaded) with its adapters, its vocabulary resized
    and checkpointing configured as the scenario says."""
    if base is not None:
        model = base
    elif scenario.quantization:
        from repros.trainer.quantized import load_quantized_tiny_qwen2

        model = load_quantized_tiny_qwen2(
            scenario.quantization, no_repack=scenario.bnb_no_repack, quant_storage=scenario.bnb_4bit_quant_storage
        )
    elif scenario.moe_experts:
        from repros.trainer.tiny_models import moe_test_model

        model = moe_test_model(scenario.moe_experts)
    else:
        model = tiny_qwen2(scenario.seed)
    if scenario.use_cache is not None:
        model.config.use_cache = scenario.use_cache
    if scenario.add_tokens:
        resize = {"pad_to_multiple_of": scenario.pad_to_multiple_of} if scenario.pad_to_multiple_of else {}
        model.resize_token_embeddings(VOCAB_SIZE + scenario.add_tokens, **resize)
    checkpointing_first = scenario.gradient_checkpointing and scenario.checkpointing_before_adapter
    if checkpointing_first:
        _enable_checkpointing(model, scenario)
    targets = target_modules_for(model, scenario)
    if scenario.lora_impl == "dschat":
        from repros.trainer.dschat_lora import convert_linear_layer_to_lora, only_optimize_lora_parameters

        model = convert_linear_layer_to_lora(model, targets, scenario.lora_r)
        model = only_optimize_lora_parameters(model)
    else:
        model = _attach_peft_adapter(model, scenario, targets)
    if scenario.gradient_checkpointing and not checkpointing_first:
        _enable_checkpointing(model, scenario)
    if scenario.input_require_grads:
        model.enable_input_require_grads()
    return model


def _enable_checkpointing(model: Any, scenario: Scenario) -> None:
    if scenario.use_reentrant is None:
        model.gradient_checkpointing_enable()
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": scenario.use_reentrant})


def target_modules_for(model: Any, scenario: Scenario) -> list[str]:
    """The ``target_modules`` the adapter on ``model`` gets: the scenario's names as written, or resolved for
    the family (``family_targets``, the ``family-target-modules`` guard); raises ``TargetModulesMatchNothing``
    where a name matches no module of the model (``repros/trainer/targets.py``), except a PEFT list as written
    of which no name matches at all: PEFT refuses that one itself, and its own error is what users meet."""
    from torch import nn

    modules = [name for name, _ in model.named_modules() if name]
    linears = [name for name, module in model.named_modules() if name and isinstance(module, nn.Linear)]
    return resolve_targets(
        scenario.model_family(),
        scenario.target_modules,
        modules,
        per_family=scenario.family_targets,
        linear_names=linears,
        # PEFT refuses a list of which no name matches ("Target modules ... not found in the base model");
        # DeepSpeed-Chat's own LoRA would silently convert nothing.
        library_refuses_total_miss=scenario.lora_impl == "peft",
    )


def lora_config(scenario: Scenario, target_modules: list[str] | None = None) -> Any:
    """PEFT's ``LoraConfig`` for the scenario, on ``target_modules`` (``target_modules_for``; default: the
    scenario's names as written)."""
    from peft import LoraConfig

    extra: dict[str, Any] = {"modules_to_save": list(scenario.modules_to_save)} if scenario.modules_to_save else {}
    if scenario.target_parameters:
        extra["target_parameters"] = list(scenario.target_parameters)
    return LoraConfig(
        r=scenario.lora_r,
        lora_alpha=scenario.lora_alpha,
        target_modules=list(scenario.target_modules) if target_modules is None else list(target_modules),
        lora_dropout=scenario.lora_dropout,
        use_dora=scenario.adapter == "dora",
        task_type="CAUSAL_LM",
        **extra,
    )


def _attach_peft_adapter(model: Any, scenario: Scenario, targets: list[str]) -> Any:
    from peft import get_peft_model

    if scenario.peft_torchao_dispatch_checked:
        from repros.trainer.torchao_dispatch import check_torchao_dispatch

        check_torchao_dispatch()
    lora = lora_config(scenario, targets)
    if scenario.peft_wrapping == "add_adapter":
        model.add_adapter(lora)
        return model
    if scenario.quantization:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    if not scenario.peft_autocast_adapter_dtype:
        return get_peft_model(model, lora, autocast_adapter_dtype=False)
    return get_peft_model(model, lora)


def scenario_facts(scenario: Scenario, model: Any) -> dict[str, Any]:
    """What a failure's signature may need to know about the run besides its message."""
    embedding = model.get_input_embeddings()
    return {
        "engine": scenario.engine,
        "family": scenario.model_family().name,
        "family_targets": scenario.family_targets,
        "adapter": scenario.adapter,
        "lora_impl": scenario.lora_impl,
        "quantization": scenario.quantization,
        # ``ds_numel``: a parameter ZeRO-3 partitioned while it loaded (zero.Init) has numel 0 here.
        "trainable_parameters": sum(getattr(p, "ds_numel", p.numel()) for _, p in adapter_parameters(model)),
        "frozen_embedding": not any(p.requires_grad for p in embedding.parameters()),
        "checkpointing": (
            ("reentrant" if checkpoints_reentrantly(scenario) else "non-reentrant")
            if scenario.gradient_checkpointing
            else "off"
        ),
        "input_require_grads": scenario.input_require_grads,
        # Whatever set it (the scenario, or PEFT when checkpointing came before the adapter).
        "embedding_output_requires_grad": _embedding_output_requires_grad(embedding),
        "ddp_find_unused_parameters": scenario.ddp_find_unused_parameters if scenario.engine == "ddp" else None,
        "fsdp1_use_orig_params": scenario.fsdp1_use_orig_params if scenario.engine == "fsdp1" else None,
        "trainer_loop": scenario.trainer_loop,
        "zero_init": scenario.zero_init,
        "target_parameters": list(scenario.target_parameters),
        "added_tokens": scenario.add_tokens,
        "modules_to_save": list(scenario.modules_to_save),
        "bf16": scenario.bf16,
        "peft_autocast_adapter_dtype": scenario.peft_autocast_adapter_dtype,
        "moe_experts": scenario.moe_experts,
        "zero3_moe_leaf_modules": scenario.zero3_moe_leaf_modules,
        "lora_dropout": scenario.lora_dropout,
        "compiled": scenario.compile_model,
        "bnb_4bit_quant_storage": scenario.bnb_4bit_quant_storage if scenario.quantization == "nf4" else None,
        "fsdp2_accelerate_prepare": scenario.fsdp2_accelerate_prepare if scenario.engine == "fsdp2" else None,
    }


def _embedding_output_requires_grad(embedding: Any) -> bool | None:
    """Whether the embedding's output requires grad, forward hooks included (one token through it)."""
    import torch

    weight = embedding.weight
    if getattr(weight, "ds_id", None) is not None or weight.numel() == 0:
        return None  # partitioned by ZeRO-3 (zero.Init): only the engine can run it
    with torch.enable_grad():
        out = embedding(torch.zeros(1, 1, dtype=torch.long, device=weight.device))
    return bool(out.requires_grad)


def adapter_parameters(model: Any) -> list[tuple[str, Any]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def training_batch(scenario: Scenario, rank: int) -> Any:
    """The rank's fixed batch; where the scenario says so, each row ends in the first added token."""
    batch = fixed_batch(rank, scenario.batch_size, scenario.seq_len)
    if scenario.add_tokens and scenario.batch_holds_added_token:
        batch[:, -1] = VOCAB_SIZE
    return batch


@dataclass
class Trained:
    """What ``train`` leaves behind: the wrapped model (a DeepSpeed engine, an FSDP2
    module or a DDP module), the bare model inside it, and the batch it trained on."""

    engine: str
    wrapped: Any
    model: Any
    batch: Any
    losses: list[float] = field(default_factory=list)
    #: The transformers ``Trainer`` that trained it (``trainer_loop="hf"``), else None.
    hf_trainer: Any = None


def json_number(value: float | None) -> float | str | None:
    """JSON has no NaN or infinity: non-finite figures travel as their names ("nan", "inf")."""
    return value if value is None or math.isfinite(value) else str(value)


def train_facts(
    losses: Sequence[float],
    grad_norms: Mapping[str, Sequence[float | None]],
    before: Mapping[str, Any],
    after: Mapping[str, Any],
) -> dict[str, Any]:
    """What every training loop records under ``facts["train"]``: the losses, each adapter's gradient
    norm per step, and how far each adapter moved (None where its full value could not be read)."""
    return {
        "losses": [json_number(v) for v in losses],
        "adapter_grad_norms": {name: [json_number(v) for v in values] for name, values in grad_norms.items()},
        "adapter_weight_delta": {
            name: (
                None
                if before.get(name) is None or after.get(name) is None
                else float((after[name] - before[name]).abs().max())
            )
            for name in grad_norms
        },
    }
