"""Long-context training with DeepSpeed's Ulysses sequence parallelism (ALST), as its tutorial writes it (F26, F27).

``UlyssesSPAttentionHF.register_with_transformers`` builds the sequence-parallel groups (its ``mpu``, DeepSpeed's
``parallel_state_sp`` module) and replaces every attention function transformers knows with one that
all-to-alls the heads across the group, so each rank attends over the whole sequence for its share of the
heads; ``deepspeed.initialize(..., mpu=mpu)`` with ``sequence_parallel_size`` in the config trains on it;
each rank trains on its slice of every batch (with ``shift_labels``: ``UlyssesSPDataLoaderAdapter``'s slicing), and
the loss is each rank's shard loss weighted by its tokens across the group. On a CPU the all-to-alls run on gloo.

Here the sequence-parallel degree is the item's world size (one group of every rank, no data parallelism
beside it): every rank is handed the same batch, which the adapter splits along the sequence. The facts are the
fixed trainer's (losses, each adapter's gradient norm per step, how far each adapter weight moved), so a
``fixed`` run is judged by the same rule. Heavy imports stay inside functions.
"""

from __future__ import annotations

import inspect
from dataclasses import replace
from typing import Any

from repros.runtime.context import RankContext
from repros.runtime.model_size import current_size
from repros.trainer.guards import Guard, apply_guards
from repros.trainer.model import adapter_parameters, build_model, scenario_facts, train_facts
from repros.trainer.scenario import Scenario
from repros.trainer.tiny_models import fixed_batch


def ulysses_config(scenario: Scenario, sequence_parallel: int) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage": scenario.zero_stage}
    if scenario.zero_stage == 3 and scenario.zero3_persistence_threshold is not None:
        zero["stage3_param_persistence_threshold"] = scenario.zero3_persistence_threshold
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": scenario.bf16},
        "zero_optimization": zero,
        "sequence_parallel_size": sequence_parallel,
        "steps_per_print": 10**9,
    }


def train_ulysses(scenario: Scenario, ctx: RankContext, guards: list[Guard]) -> None:
    import deepspeed
    import torch
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
    from deepspeed.utils import groups, safe_get_full_fp32_param, safe_get_full_grad

    effective = apply_guards(scenario, guards)
    size = current_size()
    seq_len: int = effective.seq_len or size.seq_len
    effective = replace(effective, seq_len=seq_len)
    ctx.facts["guards"] = [{"id": g.id, "reason": g.reason} for g in guards]
    sequence_parallel = ctx.world_size
    ctx.facts["sequence_parallel"] = sequence_parallel

    # DeepSpeed's communication layer over the process group the rank already has (the tutorial's
    # ``deepspeed.comm.init_distributed``): Ulysses' groups are built through it.
    deepspeed.init_distributed(dist_backend=torch.distributed.get_backend())
    model = build_model(effective)
    ctx.facts["scenario_facts"] = scenario_facts(effective, model) | {
        "sequence_parallel": sequence_parallel,
        "zero_stage": effective.zero_stage,
    }
    # What users hand over: the model they hold (a PeftModel once the adapter is attached), or, with the
    # ``ulysses-register-base-model`` guard, the transformers model inside it.
    registered = model.get_base_model() if effective.ulysses_register_base_model else model
    ctx.facts["registered_with_transformers"] = type(registered).__name__
    # DeepSpeed before 0.18.2 (PR #7656) names the sequence length ``max_length``.
    takes = inspect.signature(UlyssesSPAttentionHF.register_with_transformers).parameters
    length = {"seq_length": effective.seq_len} if "seq_length" in takes else {"max_length": effective.seq_len}
    mpu = UlyssesSPAttentionHF.register_with_transformers(
        model_name_or_path=registered,
        core_attn_implementation="sdpa",
        sequence_parallel_size=sequence_parallel,
        micro_batch_size=1,
        seq_length_is_variable=True,
        **length,
    )
    adapters = adapter_parameters(model)
    optimizer = torch.optim.AdamW([p for _, p in adapters], lr=effective.learning_rate)
    engine, *_ = deepspeed.initialize(
        model=model, optimizer=optimizer, config=ulysses_config(effective, sequence_parallel), mpu=mpu
    )

    # One sequence, the same on every rank of the group, sliced along the sequence as DeepSpeed's
    # ``UlyssesSPDataLoaderAdapter`` slices it: each rank its chunk of the tokens, their positions, and the labels
    # shifted by one (the last -100). The adapter itself is not used: in DeepSpeed 0.18.1 it all-gathers each rank's
    # 0-dimensional sequence length into 1-element buffers, which gloo refuses ("invalid tensor size"; NCCL only
    # counts elements), and with every rank holding the same sequence there is nothing to gather.
    tokens = fixed_batch(0, 1, effective.seq_len).to(ctx.device)
    chunk = seq_len // sequence_parallel
    mine = slice(ctx.rank * chunk, (ctx.rank + 1) * chunk)
    shifted = torch.nn.functional.pad(tokens, (0, 1), value=-100)[:, 1:]
    batch = {
        "input_ids": tokens[:, mine],
        "position_ids": torch.arange(effective.seq_len, device=ctx.device).unsqueeze(0)[:, mine],
        "shift_labels": shifted[:, mine],
    }
    sp_group = groups._get_sequence_parallel_group()
    sp_world = groups._get_sequence_parallel_world_size()

    def full(param: Any) -> Any:
        # ZeRO stage 0 keeps no fp32 master DeepSpeed can map back (None): the parameter itself is whole there.
        value = safe_get_full_fp32_param(param)
        if value is None and not hasattr(param, "ds_id"):
            value = param
        return None if value is None else value.detach().float().clone()

    def grad_norm(param: Any) -> float | None:
        grad = safe_get_full_grad(param)
        return None if grad is None else float(grad.detach().float().norm())

    before = {name: full(p) for name, p in adapters}
    losses: list[float] = []
    grad_norms: dict[str, list[float | None]] = {name: [] for name, _ in adapters}
    engine.train()
    ctx.meters.training_begins()
    for _ in range(ctx.steps):
        ctx.meters.resume()
        shift_labels = batch["shift_labels"]
        outputs = engine(input_ids=batch["input_ids"], position_ids=batch["position_ids"])
        shard_loss = engine.module.loss_function(
            logits=outputs.logits, labels=None, shift_labels=shift_labels, vocab_size=engine.module.config.vocab_size
        )
        # The tutorial's differentiable weighted aggregation of the shards' losses across the group.
        losses_per_rank = torch.distributed.nn.functional.all_gather(shard_loss, group=sp_group)
        good = (shift_labels != -100).view(-1).sum()
        good_per_rank = torch.distributed.nn.functional.all_gather(good, group=sp_group)
        loss = sum(losses_per_rank[r] * good_per_rank[r] for r in range(sp_world)) / max(sum(good_per_rank), 1)
        engine.backward(loss)
        ctx.meters.pause()
        for name, param in adapters:
            grad_norms[name].append(grad_norm(param))
        ctx.meters.resume()
        engine.step()
        ctx.meters.pause()
        ctx.meters.end_step()
        losses.append(float(loss.detach().float()))
    after = {name: full(p) for name, p in adapters}
    ctx.facts["train"] = train_facts(losses, grad_norms, before, after)
