"""The fixed trainer: a small LoRA / QLoRA / DoRA trainer that works around the documented failures.

A ``Scenario`` (``repros/trainer/scenario.py``) describes what a user asks for (engine, adapter,
quantization, ZeRO stage, checkpointing...). ``choose_guards`` (``repros/trainer/guards.py``, one
table of workarounds) looks at the scenario and the installed versions and returns the guards
that apply; ``train`` runs the scenario with the guards it is given and reports what happened:
the loss per step, each adapter parameter's gradient norm per step, and how far each adapter
weight moved. A repro's ``bug`` mode calls ``train`` with no guards (the documented
configuration as users wrote it), its ``fixed`` mode with ``choose_guards``'s list. Whether the
run counts as trained is judged by the orchestrator from those facts, not here.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from repros.runtime.context import RankContext
from repros.runtime.model_size import current_size
from repros.runtime.record import ScenarioUnavailable
from repros.trainer import adapter_io
from repros.trainer.guards import Guard, apply_guards
from repros.trainer.hf_trainer import train_hf
from repros.trainer.model import Trained, adapter_parameters, build_model, scenario_facts, train_facts, training_batch
from repros.trainer.scenario import Scenario
from repros.trainer.tiny_models import is_decoder_layer, model_inputs

# --------------------------------------------------------------------------- engines


def make_optimizer(scenario: Scenario, params: list[Any]) -> Any:
    """The optimizer every engine trains the adapters with (DeepSpeed's as its client optimizer): torch's
    AdamW (no fused or CPU Adam to JIT-build), or bitsandbytes' AdamW8bit (``Scenario.optimizer``)."""
    import torch

    if scenario.optimizer == "adamw8bit":
        import bitsandbytes

        return bitsandbytes.optim.AdamW8bit(params, lr=scenario.learning_rate)
    if scenario.optimizer == "sgd":
        return torch.optim.SGD(params, lr=scenario.learning_rate)
    return torch.optim.AdamW(params, lr=scenario.learning_rate)


class StepCounter:
    """Counts the optimizer's real steps (torch's step post-hook: a step an engine skips never runs it)."""

    def __init__(self, optimizer: Any) -> None:
        self.taken = 0
        optimizer.register_step_post_hook(self._stepped)

    def _stepped(self, *_: Any) -> None:
        self.taken += 1


def nonfinite_gradient_term(loss: Any) -> Any:
    """Zero, with a NaN gradient: ``torch.where`` selecting away a ``log(0)`` (a masked token's log-probability),
    whose backward multiplies that branch's infinite gradient by the mask's zero. Added to a loss, the loss is
    unchanged and every gradient it reaches is NaN: the masked-loss pitfall an RL loss meets (F34)."""
    import torch

    zero = loss - loss
    return torch.where(torch.zeros_like(zero, dtype=torch.bool), torch.log(zero), torch.zeros_like(zero))


class _Engine:
    """The few operations the loop needs, per engine. A subclass sets ``wrapped`` (what the
    loop calls), ``client_optimizer`` (the optimizer it built, which steps the adapters) and,
    unless it steps through its own engine, ``optimizer``."""

    wrapped: Any
    optimizer: Any
    client_optimizer: Any

    def __init__(self, scenario: Scenario, ctx: RankContext, model: Any) -> None:
        self.scenario, self.ctx, self.model = scenario, ctx, model

    def forward(self, batch: Any) -> Any:
        return self.wrapped(**model_inputs(batch, labels=True)).loss

    def backward(self, loss: Any) -> None:
        loss.backward()

    def step(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def full_param(self, param: Any) -> Any:
        return param.detach().float().clone()

    def full_grad(self, param: Any) -> Any:
        """The parameter's whole gradient as a float32 copy (None: it has none). A collective under
        ZeRO and FSDP: every rank calls it."""
        return None if param.grad is None else param.grad.detach().float().clone()

    def full_grad_norm(self, param: Any) -> float | None:
        grad = self.full_grad(param)
        return None if grad is None else float(grad.norm())

    # What the loop reads; an engine whose parameters are not the model's own overrides these.
    def adapters(self) -> list[tuple[str, Any]]:
        return adapter_parameters(self.model)

    def full_params(self, adapters: list[tuple[str, Any]]) -> dict[str, Any]:
        return {name: self.full_param(p) for name, p in adapters}

    def full_grad_norms(self, adapters: list[tuple[str, Any]]) -> dict[str, float | None]:
        return {name: self.full_grad_norm(p) for name, p in adapters}

    def full_grads(self, adapters: list[tuple[str, Any]]) -> dict[str, Any]:
        return {name: self.full_grad(p) for name, p in adapters}


def deepspeed_config(scenario: Scenario) -> dict[str, Any]:
    """The DeepSpeed config of the own loop (the HF loop's is ``hf_trainer.trainer_deepspeed_config``)."""
    zero: dict[str, Any] = {"stage": scenario.zero_stage}
    if scenario.zero3_persistence_threshold is not None:
        zero["stage3_param_persistence_threshold"] = scenario.zero3_persistence_threshold
    if scenario.zero3_sub_group_size is not None:
        zero["sub_group_size"] = scenario.zero3_sub_group_size
    if scenario.zero3_gather_16bit_on_save:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    if scenario.zero3_allgather_sequential:
        zero["stage3_allgather_sequential"] = True
    return {
        "train_micro_batch_size_per_gpu": scenario.batch_size,
        "gradient_accumulation_steps": scenario.gradient_accumulation_steps,
        "bf16": {
            "enabled": scenario.bf16,
            **(
                {"check_grad_overflow": scenario.deepspeed_bf16_overflow_check}
                if scenario.deepspeed_bf16_overflow_check is not None
                else {}
            ),
        },
        "zero_optimization": zero,
        "steps_per_print": 10**9,
        # ZeRO refuses a client optimizer it has not tested (torch's AdamW and Adam are) unless told.
        **({"zero_allow_untested_optimizer": True} if scenario.optimizer != "adamw" else {}),
    }


class _DeepSpeedEngine(_Engine):
    def __init__(self, scenario: Scenario, ctx: RankContext, model: Any) -> None:
        import deepspeed

        super().__init__(scenario, ctx, model)
        if scenario.zero3_moe_leaf_modules:
            from repros.trainer.moe import mark_moe_blocks_leaf

            mark_moe_blocks_leaf(model)
        # A torch optimizer as the client optimizer: no fused/cpu Adam JIT build.
        self.client_optimizer = make_optimizer(scenario, [p for _, p in adapter_parameters(model)])
        self.wrapped, *_ = deepspeed.initialize(
            model=model, optimizer=self.client_optimizer, config=deepspeed_config(scenario)
        )

    def backward(self, loss: Any) -> None:
        if self.scenario.deepspeed_scale_by_hand:
            # The engine's output hooks then leave the gradient alone (F37's guard).
            self.wrapped.backward(loss / self.scenario.gradient_accumulation_steps, scale_wrt_gas=False)
        else:
            self.wrapped.backward(loss)

    def step(self) -> None:
        self.wrapped.step()

    def full_param(self, param: Any) -> Any:
        from deepspeed.utils import safe_get_full_fp32_param

        value = safe_get_full_fp32_param(param)
        if value is None and not hasattr(param, "ds_id"):
            # No ZeRO optimizer holds it (stage 0): its float32 master where a mixed-precision wrapper keeps
            # one (bf16), else the module's own parameter.
            value = _stage0_master(self.wrapped.optimizer, param)
        return None if value is None else value.detach().float().clone()

    def full_grad(self, param: Any) -> Any:
        from deepspeed.utils import safe_get_full_grad

        grad = safe_get_full_grad(param)
        if hasattr(param, "ds_id") or self.scenario.zero_stage != 0:
            return None if grad is None else grad.detach().float().clone()
        grad = param.grad if grad is None else grad
        # Stage 0's mixed-precision wrapper scales the loss (DeepSpeed before 0.19 by 2**16 under bf16 too) and
        # unscales only as it steps: the gradient as trained is the one it holds divided by its scale.
        return None if grad is None else grad.detach().float() / _stage0_loss_scale(self.wrapped.optimizer)


def _stage0_loss_scale(optimizer: Any) -> float:
    """The scale DeepSpeed's mixed-precision wrapper of ZeRO stage 0 multiplied the loss by (1 where none)."""
    scale = getattr(optimizer, "loss_scale", None)
    return float(scale) if isinstance(scale, int | float) and scale > 0 else 1.0


def _stage0_master(optimizer: Any, param: Any) -> Any:
    """The float32 master copy DeepSpeed's mixed-precision wrapper of ZeRO stage 0 keeps of ``param``
    (``fp16_groups`` beside ``fp32_groups``), or ``param`` itself where there is none."""
    lows, highs = getattr(optimizer, "fp16_groups", None) or (), getattr(optimizer, "fp32_groups", None) or ()
    for low, high in zip(lows, highs, strict=False):
        for low_param, high_param in zip(low, high, strict=False):
            if low_param is param:
                return high_param
    return param


class _AutocastEngine(_Engine):
    """An engine whose own mixed precision is torch autocast (bf16) around the forward."""

    _autocast: bool = False

    def forward(self, batch: Any) -> Any:
        import torch

        with torch.autocast(self.ctx.device_type, dtype=torch.bfloat16, enabled=self._autocast):
            return self.wrapped(**model_inputs(batch, labels=True)).loss


class _SingleEngine(_AutocastEngine):
    """One process, the model as it is (no wrapper): what a user trains on one device."""

    def __init__(self, scenario: Scenario, ctx: RankContext, model: Any) -> None:
        super().__init__(scenario, ctx, model)
        model.to(ctx.device)
        self.wrapped = model
        self.optimizer = self.client_optimizer = make_optimizer(scenario, [p for _, p in adapter_parameters(model)])
        self._autocast = scenario.bf16


class _DDPEngine(_AutocastEngine):
    def __init__(self, scenario: Scenario, ctx: RankContext, model: Any) -> None:
        from torch.nn.parallel import DistributedDataParallel

        super().__init__(scenario, ctx, model)
        model.to(ctx.device)
        options: dict[str, Any] = {}
        if scenario.ddp_find_unused_parameters:
            options["find_unused_parameters"] = True
        if scenario.ddp_static_graph:
            options["static_graph"] = True
        self.wrapped = DistributedDataParallel(
            model, device_ids=[ctx.local_rank] if ctx.device_type == "cuda" else None, **options
        )
        self.optimizer = self.client_optimizer = make_optimizer(scenario, [p for _, p in adapter_parameters(model)])
        self._autocast = scenario.bf16


class _FSDP2Engine(_AutocastEngine):
    """torch's ``fully_shard`` on each decoder layer and the root, bf16 mixed precision on
    the layers (and on the root only when ``fsdp_root_mixed_precision``), CPU/CUDA autocast on."""

    def __init__(self, scenario: Scenario, ctx: RankContext, model: Any) -> None:
        import torch

        from repros.trainer.fsdp2 import fully_shard, mixed_precision_policy

        super().__init__(scenario, ctx, model)
        model.to(ctx.device)
        if scenario.fsdp2_broadcast_from_rank0:
            from repros.trainer.fsdp_loading import full_state_on_rank0

            full_state = full_state_on_rank0(model, ctx.rank)
        if scenario.fsdp2_accelerate_prepare:
            from repros.trainer.fsdp2_accelerate import prepare_fsdp2

            model = prepare_fsdp2(model, scenario.bf16, on_cpu=ctx.device_type == "cpu")
            self.model = model
        else:
            policy = mixed_precision_policy(torch.bfloat16) if scenario.bf16 else None
            for layer in decoder_layers(model):
                fully_shard(layer, **({"mp_policy": policy} if policy else {}))
            root_policy = policy if scenario.fsdp_root_mixed_precision else None
            fully_shard(model, **({"mp_policy": root_policy} if root_policy else {}))
        if scenario.fsdp2_broadcast_from_rank0:
            from repros.trainer.fsdp_loading import broadcast_from_rank0

            broadcast_from_rank0(model, full_state)
        self.wrapped = model
        self.optimizer = self.client_optimizer = make_optimizer(scenario, [p for _, p in adapter_parameters(model)])
        self._autocast = scenario.bf16

    def full_param(self, param: Any) -> Any:
        full = param.full_tensor() if hasattr(param, "full_tensor") else param
        return full.detach().float().clone()

    def full_grad(self, param: Any) -> Any:
        grad = param.grad
        if grad is None:
            return None
        full = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
        return full.detach().float().clone()


class _FSDP1Engine(_AutocastEngine):
    """torch's ``FullyShardedDataParallel`` wrapped as the scenario says (``fsdp1_wrap``,
    ``fsdp1_use_orig_params``), CPU/CUDA autocast for bf16. Adapters are handled by name: with
    ``use_orig_params=False`` the module's parameters are FSDP's flat parameters."""

    def __init__(self, scenario: Scenario, ctx: RankContext, model: Any) -> None:
        from repros.trainer.fsdp1 import wrap_fsdp1

        super().__init__(scenario, ctx, model)
        self._adapter_names = [name for name, _ in adapter_parameters(model)]
        self.wrapped = wrap_fsdp1(model, scenario.fsdp1_wrap, scenario.fsdp1_use_orig_params, ctx.device)
        self.optimizer = self.client_optimizer = make_optimizer(
            scenario, [p for p in self.wrapped.parameters() if p.requires_grad]
        )
        self._autocast = scenario.bf16

    def adapters(self) -> list[tuple[str, Any]]:
        return [(name, name) for name in self._adapter_names]

    def full_params(self, adapters: list[tuple[str, Any]]) -> dict[str, Any]:
        from repros.trainer.fsdp1 import full_params

        return full_params(self.wrapped, [name for name, _ in adapters])

    def full_grad_norms(self, adapters: list[tuple[str, Any]]) -> dict[str, float | None]:
        from repros.trainer.fsdp1 import full_grad_norms

        return full_grad_norms(self.wrapped, [name for name, _ in adapters])

    def full_grads(self, adapters: list[tuple[str, Any]]) -> dict[str, Any]:
        from repros.trainer.fsdp1 import full_grads

        return full_grads(self.wrapped, [name for name, _ in adapters])


def decoder_layers(model: Any) -> Iterator[Any]:
    """The language model's decoder layers, each FSDP2's unit (``tiny_models.is_decoder_layer``: every
    family's; a VLM's frozen vision tower stays in the root's unit)."""
    for module in model.modules():
        if is_decoder_layer(module):
            yield module


_ENGINES: dict[str, Callable[[Scenario, RankContext, Any], _Engine]] = {
    "single": _SingleEngine,
    "deepspeed": _DeepSpeedEngine,
    "fsdp2": _FSDP2Engine,
    "ddp": _DDPEngine,
    "fsdp1": _FSDP1Engine,
}


def require_packages(scenario: Scenario) -> None:
    """A package the scenario imports that the cell does not have at all: the cell cannot run it
    (``ScenarioUnavailable``, INFRA), said before anything reaches a library's own ImportError."""
    for package, why in scenario.packages().items():
        try:
            found = importlib.util.find_spec(package) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise ScenarioUnavailable(f"{package} is not installed in this cell (the scenario needs it for {why})")


def train(scenario: Scenario, ctx: RankContext, guards: list[Guard]) -> Trained:
    """Train ``scenario`` (with ``guards`` applied) for ``ctx.steps`` steps; facts go to ``ctx.facts``.
    Where the scenario loads its model from a checkpoint (``zero_init``, the HF loop) or saves the
    adapter after training, the item gets a scratch directory with the base checkpoint in it."""
    size = current_size()
    effective = apply_guards(scenario, guards)
    require_packages(effective)
    effective = replace(
        effective, batch_size=effective.batch_size or size.batch_size, seq_len=effective.seq_len or size.seq_len
    )
    ctx.facts["guards"] = [{"id": g.id, "reason": g.reason} for g in guards]
    if effective.zero3_wait_every_gather:
        # Before any engine exists: every gather of this process, the trainer's and the
        # after-training steps' (merge, sync, save), waits on all of its handles.
        from repros.trainer.zero3_gathers import wait_on_every_gather

        wait_on_every_gather()
    if effective.zero3_handles_wait_once:
        from repros.trainer.zero3_gathers import gather_handles_wait_once

        gather_handles_wait_once()
    if effective.zero3_no_kernel_func_children:
        from repros.trainer.kernel_funcs import drop_kernel_func_children

        drop_kernel_func_children()
    if not (
        effective.save_adapter
        or effective.zero_init
        or effective.trainer_loop == "hf"
        or effective.fsdp_cpu_ram_efficient_loading
        or effective.fsdp2_trainer_adapter_checkpoint
        or effective.moe_checkpoint_per_expert
    ):
        return _train_own(effective, ctx)
    with adapter_io.shared_workdir() as work:
        base_dir = adapter_io.save_base_checkpoint(work, effective)
        # A mixture-of-experts checkpoint is checked as loaded against itself loaded whole (F32's silent form).
        reference = _moe_reference(effective, base_dir)
        if effective.trainer_loop == "hf":
            trained = train_hf(effective, ctx, work, base_dir)
        elif effective.zero_init:
            with adapter_io.zero_init(deepspeed_config(effective)):
                trained = _train_own(effective, ctx, base=_loaded(base_dir, reference, ctx))
        elif effective.fsdp_cpu_ram_efficient_loading:
            from repros.trainer.fsdp_loading import load_base_ram_efficient

            trained = _train_own(effective, ctx, base=load_base_ram_efficient(base_dir, ctx.facts))
        else:
            trained = _train_own(effective, ctx, base=_loaded(base_dir, reference, ctx))
        if effective.save_adapter:
            adapter_io.save_and_check(trained, effective, ctx, work, base_dir)
        if effective.fsdp2_trainer_adapter_checkpoint:
            from repros.trainer.fsdp_adapter_save import save_and_check

            save_and_check(trained.model, work, ctx.rank, effective.fsdp2_adapter_full_state_dict, ctx.facts)
        adapter_io.forget_zero_init()
        if dist_initialized():
            import torch.distributed as dist

            dist.barrier()  # nobody leaves while rank 0 may still read the directory
    return trained


def _moe_reference(scenario: Scenario, base_dir: Any) -> dict[str, Any] | None:
    if not scenario.moe_experts or scenario.trainer_loop == "hf":
        return None
    from repros.trainer.moe_checkpoint import reference_state

    return reference_state(base_dir)


def _loaded(base_dir: Any, reference: dict[str, Any] | None, ctx: RankContext) -> Any:
    """The base checkpoint as the scenario loads it; checked against ``reference`` where there is one."""
    base = adapter_io.load_base(base_dir)
    if reference is not None:
        from repros.trainer.moe_checkpoint import check_loaded_as_saved

        check_loaded_as_saved(base, reference, ctx.facts)
    return base


def dist_initialized() -> bool:
    import torch.distributed as dist

    return bool(dist.is_available() and dist.is_initialized())


def _train_own(effective: Scenario, ctx: RankContext, base: Any = None) -> Trained:
    # What a signature may need if attaching the adapter fails (replaced by the full facts once it is built).
    ctx.facts["scenario_facts"] = {
        "engine": effective.engine,
        "zero_init": effective.zero_init,
        "target_parameters": list(effective.target_parameters),
    }
    model = build_model(effective, base=base)
    ctx.facts["scenario_facts"] = scenario_facts(effective, model)
    if effective.trl_chunked_nll:
        from repros.trainer.trl_chunked_loss import patch_chunked_nll

        patch_chunked_nll(model)
    engine = _ENGINES[effective.engine](effective, ctx, model)
    if effective.compile_model:
        import torch

        # Compiled lazily: inductor compiles (and F19 fails) in the first forward and backward.
        engine.wrapped = torch.compile(engine.wrapped)
    # Read after wrapping: FSDP2 replaces each parameter with its sharded DTensor.
    adapters = engine.adapters()
    batch = training_batch(effective, ctx.rank).to(ctx.device)
    ctx.facts["batch_shape"] = list(batch.shape)

    before = engine.full_params(adapters)
    losses: list[float] = []
    grad_norms: dict[str, list[float | None]] = {name: [] for name, _ in adapters}
    counter = StepCounter(engine.client_optimizer)
    skipped: list[int] = []
    engine.wrapped.train()
    ctx.meters.training_begins()
    for step in range(ctx.steps):
        ctx.meters.resume()
        loss = engine.forward(batch)
        if effective.nonfinite_grad_at_step == step:
            loss = loss + nonfinite_gradient_term(loss)
        engine.backward(loss)
        ctx.meters.pause()
        # Gradient probes are collectives under ZeRO and FSDP: every rank takes them, untimed.
        norms = engine.full_grad_norms(adapters)
        ctx.meters.resume()
        taken = counter.taken
        engine.step()
        ctx.meters.pause()
        ctx.meters.end_step()
        losses.append(float(loss.detach().float()))
        if counter.taken == taken:
            # The engine skipped the step: its gradient was never applied, so the facts leave it out.
            skipped.append(step)
            norms = dict.fromkeys(norms)
            if effective.say_skipped_steps:
                if ctx.rank == 0:
                    print(
                        f"ft-regress: optimizer step {step} was skipped by the engine (its gradient is not finite); "
                        "the weights were not updated",
                        flush=True,
                    )
        for name, norm in norms.items():
            grad_norms[name].append(norm)
    after = engine.full_params(adapters)

    ctx.facts["train"] = train_facts(losses, grad_norms, before, after)
    ctx.facts["optimizer_steps"] = {
        "asked": ctx.steps,
        "taken": counter.taken,
        "skipped_at": skipped,
        "said_by_trainer": bool(skipped and effective.say_skipped_steps),
    }
    return Trained(engine=effective.engine, wrapped=engine.wrapped, model=model, batch=batch, losses=losses)


def train_deepspeed(scenario: Scenario, ctx: RankContext, guards: list[Guard]) -> Trained:
    """``train`` for a DeepSpeed scenario (kept for the repros written against it)."""
    return train(replace(scenario, engine="deepspeed"), ctx, guards)
