"""The fixed trainer: a small LoRA trainer that works around the documented failures.

A scenario describes what a user asks for (adapter, ZeRO stage, checkpointing...).
``choose_guards`` looks at the scenario and the installed versions and returns the
workarounds that apply; ``train`` runs the scenario with the guards it is given and
reports what happened: the loss per step, each adapter parameter's gradient norm
per step, and how far each adapter weight moved. A repro's ``bug`` mode calls
``train`` with no guards (the documented configuration as users wrote it), its
``fixed`` mode with ``choose_guards``'s list. Whether the run counts as trained is
judged by the orchestrator from those facts, not here.

Guards (each recorded by id in the result):
- ``use-cache-off``: under gradient checkpointing, ``config.use_cache = False``.
- ``zero3-reentrant-checkpointing``: ZeRO-3 with frozen base weights and non-reentrant
  checkpointing on a DeepSpeed without PR #8148 re-partitions frozen weights to
  ``[0]`` before torch checks the recompute (F1); checkpoint reentrantly instead.
- ``input-require-grads``: under reentrant checkpointing with a frozen embedding no
  checkpointed block's input requires grad, so the adapters inside get none (F5);
  make the embedding output require grad.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from importlib import metadata
from typing import Any

from packaging.version import Version

from repros.common.context import RankContext
from repros.common.tiny_models import fixed_batch, tiny_qwen2

#: First DeepSpeed release with PR #8148 ("Z3: Support for activation ckpt with
#: frozen params"). Established by running F1 (see repros/f1_zero3_frozen_ckpt.py).
DEEPSPEED_Z3_FROZEN_CKPT_FIX = Version("0.19.3")


@dataclass(frozen=True)
class Scenario:
    zero_stage: int = 3
    bf16: bool = True
    gradient_checkpointing: bool = True
    use_reentrant: bool = False
    use_cache: bool | None = None  # None: leave the model config's default
    input_require_grads: bool = False
    lora_r: int = 8
    lora_alpha: int = 16
    target_modules: tuple[str, ...] = ("q_proj", "v_proj")
    learning_rate: float = 1e-2
    batch_size: int = 2
    seq_len: int = 16


@dataclass(frozen=True)
class Guard:
    id: str
    reason: str


def _version(package: str) -> Version | None:
    try:
        return Version(metadata.version(package))
    except metadata.PackageNotFoundError:
        return None


def choose_guards(scenario: Scenario) -> list[Guard]:
    guards: list[Guard] = []
    if scenario.gradient_checkpointing and scenario.use_cache is not False:
        guards.append(Guard("use-cache-off", "KV cache is useless and harmful under gradient checkpointing"))
    deepspeed = _version("deepspeed")
    reentrant = scenario.use_reentrant
    if (
        scenario.zero_stage == 3
        and scenario.gradient_checkpointing
        and not reentrant
        and deepspeed is not None
        and deepspeed < DEEPSPEED_Z3_FROZEN_CKPT_FIX
    ):
        guards.append(
            Guard(
                "zero3-reentrant-checkpointing",
                f"deepspeed {deepspeed} < {DEEPSPEED_Z3_FROZEN_CKPT_FIX} re-partitions frozen weights "
                "during non-reentrant recompute (F1, DeepSpeed PR #8148)",
            )
        )
        reentrant = True
    if scenario.gradient_checkpointing and reentrant and not scenario.input_require_grads:
        guards.append(
            Guard(
                "input-require-grads", "reentrant checkpointing with a frozen embedding gives adapters no gradient (F5)"
            )
        )
    return guards


def apply_guards(scenario: Scenario, guards: list[Guard]) -> Scenario:
    ids = {g.id for g in guards}
    if "use-cache-off" in ids:
        scenario = replace(scenario, use_cache=False)
    if "zero3-reentrant-checkpointing" in ids:
        scenario = replace(scenario, use_reentrant=True)
    if "input-require-grads" in ids:
        scenario = replace(scenario, input_require_grads=True)
    return scenario


def _build_model(scenario: Scenario) -> Any:
    from peft import LoraConfig, get_peft_model

    model = tiny_qwen2()
    if scenario.use_cache is not None:
        model.config.use_cache = scenario.use_cache
    lora = LoraConfig(
        r=scenario.lora_r,
        lora_alpha=scenario.lora_alpha,
        target_modules=list(scenario.target_modules),
        lora_dropout=0.0,
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(model, lora)
    if scenario.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": scenario.use_reentrant})
    if scenario.input_require_grads:
        model.enable_input_require_grads()
    return model


def _deepspeed_config(scenario: Scenario) -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": scenario.batch_size,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": scenario.bf16},
        "zero_optimization": {"stage": scenario.zero_stage},
        "steps_per_print": 10**9,
    }


def _full_param(param: Any) -> Any:
    from deepspeed.utils import safe_get_full_fp32_param

    value = safe_get_full_fp32_param(param)
    return None if value is None else value.detach().float().clone()


def _full_grad_norm(param: Any) -> float | None:
    from deepspeed.utils import safe_get_full_grad

    grad = safe_get_full_grad(param)
    return None if grad is None else float(grad.detach().float().norm())


def train_deepspeed(scenario: Scenario, ctx: RankContext, guards: list[Guard]) -> None:
    """Train ``scenario`` with DeepSpeed for ``ctx.steps`` steps; facts go to ``ctx.facts``."""
    import deepspeed
    import torch

    effective = apply_guards(scenario, guards)
    ctx.facts["guards"] = [{"id": g.id, "reason": g.reason} for g in guards]
    model = _build_model(effective)
    adapters = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    # A torch optimizer as the client optimizer: no fused/cpu Adam JIT build.
    optimizer = torch.optim.AdamW([p for _, p in adapters], lr=effective.learning_rate)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=_deepspeed_config(effective))
    batch = fixed_batch(ctx.rank, effective.batch_size, effective.seq_len).to(ctx.device)

    before = {name: _full_param(p) for name, p in adapters}
    losses: list[float] = []
    grad_norms: dict[str, list[float | None]] = {name: [] for name, _ in adapters}
    engine.train()
    for _ in range(ctx.steps):
        ctx.clock.resume()
        loss = engine(input_ids=batch, labels=batch).loss
        engine.backward(loss)
        ctx.clock.pause()
        # Gradient probes are collectives under ZeRO: every rank takes them, untimed.
        for name, param in adapters:
            grad_norms[name].append(_full_grad_norm(param))
        ctx.clock.resume()
        engine.step()
        ctx.clock.pause()
        ctx.clock.end_step()
        losses.append(float(loss.detach().float()))
    after = {name: _full_param(p) for name, p in adapters}

    ctx.facts["train"] = {
        "losses": [_json_number(v) for v in losses],
        "adapter_grad_norms": {k: [_json_number(v) for v in vs] for k, vs in grad_norms.items()},
        "adapter_weight_delta": {
            name: (
                None if before[name] is None or after[name] is None else float((after[name] - before[name]).abs().max())
            )
            for name, _ in adapters
        },
    }


def _json_number(value: float | None) -> float | str | None:
    """JSON has no NaN or infinity: non-finite figures travel as their names ("nan", "inf")."""
    return value if value is None or math.isfinite(value) else str(value)
