"""accelerate's FSDP2 context parallelism, as its guide writes the loop (F28; CUDA only).

``Accelerator(parallelism_config=ParallelismConfig(cp_size=N), fsdp_plugin=FSDP2)`` shards the model with FSDP2
over a device mesh whose ``cp`` dimension splits each sequence across the ranks, and every step runs inside
``accelerator.maybe_context_parallel(buffers=[...], buffer_seq_dims=[...])``, torch's ``context_parallel``, which
needs the SDPA flash or efficient attention kernels (CUDA). Here the context-parallel degree is the item's world
size. accelerate refuses a ``ParallelismConfig`` on a CPU run (``DistributedType.MULTI_CPU``), so a CPU never
gets here. The facts are the fixed trainer's. Heavy imports stay inside functions.
"""

from __future__ import annotations

from typing import Any

from repros.runtime.context import RankContext
from repros.trainer.guards import Guard, apply_guards
from repros.trainer.model import adapter_parameters, build_model, scenario_facts, train_facts
from repros.trainer.scenario import Scenario
from repros.trainer.tiny_models import fixed_batch


def train_context_parallel(scenario: Scenario, ctx: RankContext, guards: list[Guard]) -> None:
    import torch
    from accelerate import Accelerator
    from accelerate.utils import FullyShardedDataParallelPlugin, ParallelismConfig

    effective = apply_guards(scenario, guards)
    ctx.facts["guards"] = [{"id": g.id, "reason": g.reason} for g in guards]
    config = ParallelismConfig(dp_shard_size=1, cp_size=ctx.world_size)
    if effective.accelerate_cp_clear_sp_backend:
        config.sp_backend = None
    accelerator = Accelerator(
        parallelism_config=config,
        fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2),
        mixed_precision="bf16" if effective.bf16 else "no",
    )
    model = build_model(effective)
    ctx.facts["scenario_facts"] = scenario_facts(effective, model) | {"context_parallel": ctx.world_size}
    optimizer = torch.optim.AdamW([p for _, p in adapter_parameters(model)], lr=effective.learning_rate)
    model, optimizer = accelerator.prepare(model, optimizer)
    adapters = adapter_parameters(model)

    def full(param: Any) -> Any:
        value = param.full_tensor() if hasattr(param, "full_tensor") else param
        return value.detach().float().clone()

    def grad_norm(param: Any) -> float | None:
        if param.grad is None:
            return None
        grad = param.grad.full_tensor() if hasattr(param.grad, "full_tensor") else param.grad
        return float(grad.detach().float().norm())

    before = {name: full(p) for name, p in adapters}
    losses: list[float] = []
    grad_norms: dict[str, list[float | None]] = {name: [] for name, _ in adapters}
    model.train()
    ctx.meters.training_begins()
    for _ in range(ctx.steps):
        ids = fixed_batch(0, 1, 16 * ctx.world_size).to(ctx.device)
        labels = ids.clone()
        ctx.meters.resume()
        with accelerator.maybe_context_parallel(
            buffers=[ids, labels], buffer_seq_dims=[1, 1], no_restore_buffers={ids, labels}
        ):
            loss = model(input_ids=ids, labels=labels).loss
            accelerator.backward(loss)
        ctx.meters.pause()
        for name, param in adapters:
            grad_norms[name].append(grad_norm(param))
        ctx.meters.resume()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        ctx.meters.pause()
        ctx.meters.end_step()
        losses.append(float(loss.detach().float()))
    after = {name: full(p) for name, p in adapters}
    ctx.facts["train"] = train_facts(losses, grad_norms, before, after)
