"""The fixed trainer's scenarios driven by transformers' own ``Trainer`` (``trainer_loop="hf"``).

Users train LoRA under DeepSpeed mostly through ``Trainer`` (or TRL's trainers built on it) with
``TrainingArguments(deepspeed=config)``; some failures live in its code (its ``save_model``), or in
the order it suggests: the arguments (and with them an ``HfDeepSpeedConfig``) made before the model
is loaded, so that under ZeRO-3 ``from_pretrained`` runs inside ``deepspeed.zero.Init``
(``Scenario.zero_init``).

What is measured, without changing what the Trainer does:
- the loss of every step, as the Trainer's ``compute_loss`` returns it (a subclass calls the
  library's own and keeps the value);
- every adapter parameter's gradient per step: a tensor hook on each adapter parameter adds up the
  gradient autograd hands it on this rank, and after the step the ranks average them (what
  DeepSpeed reduces) - DeepSpeed steps inside ``accelerator.backward``, so there is no moment
  between backward and step to ask it;
- each adapter weight before and after training (``safe_get_full_fp32_param`` in the Trainer's
  ``on_train_begin`` / ``on_train_end`` callbacks, on every rank).
Each rank trains on its own fixed batch every step (``get_train_dataloader``, which the Trainer
documents as the method to override, gives each rank its batch, unsharded), as the own loop does.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from repros.runtime.context import RankContext
from repros.trainer import adapter_io
from repros.trainer.model import Trained, adapter_parameters, build_model, scenario_facts, train_facts, training_batch
from repros.trainer.scenario import Scenario
from repros.trainer.tiny_models import model_inputs


def trainer_deepspeed_config(scenario: Scenario) -> dict[str, Any]:
    """A ZeRO config as HF's DeepSpeed guide writes it: sizes and precision ``auto`` (filled from the
    ``TrainingArguments``), a DeepSpeed ``WarmupLR`` scheduler, the Trainer's torch AdamW as the
    client optimizer (no DeepSpeed optimizer section, so no Adam op is built).

    The scheduler matters on transformers 4.57 with torch 2.13: without one the Trainer builds a
    torch ``LambdaLR`` over its two parameter groups, DeepSpeed drops the empty no-decay group of a
    LoRA model in place, and torch's strict zip in ``LRScheduler`` raises at step 1 (F11;
    ``Scenario.deepspeed_scheduler`` False leaves the scheduler out as users do). Keys in
    ``Scenario.ds_config_omits`` are left out, as a user's own config may (F20)."""
    zero: dict[str, Any] = {"stage": scenario.zero_stage}
    if scenario.zero3_persistence_threshold is not None:
        zero["stage3_param_persistence_threshold"] = scenario.zero3_persistence_threshold
    if scenario.zero3_gather_16bit_on_save:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    if scenario.zero3_allgather_sequential:
        zero["stage3_allgather_sequential"] = True
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "bf16": {"enabled": "auto"},
        "zero_optimization": zero,
        "steps_per_print": 10**9,
    }
    if scenario.deepspeed_scheduler:
        config["scheduler"] = {
            "type": "WarmupLR",
            "params": {"warmup_min_lr": 0, "warmup_max_lr": "auto", "warmup_num_steps": "auto"},
        }
    for key in scenario.ds_config_omits:
        *parents, leaf = key.split(".")
        node: Any = config
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    return config


def deepspeed_settings(trainer: Any) -> dict[str, Any]:
    """What the DeepSpeed engine the Trainer trained with actually used, beside what the
    ``TrainingArguments`` asked for (F20 compares them)."""
    engine = trainer.model_wrapped
    args = trainer.args
    scheduler = getattr(engine, "lr_scheduler", None)
    max_lrs = getattr(scheduler, "max_lrs", None)
    return {
        "used": {
            "train_micro_batch_size_per_gpu": int(engine.train_micro_batch_size_per_gpu()),
            "gradient_accumulation_steps": int(engine.gradient_accumulation_steps()),
            "gradient_clipping": float(engine.gradient_clipping()),
            # The peak learning rate of DeepSpeed's own scheduler (None: the Trainer's scheduler runs).
            "peak_lr": float(max(max_lrs)) if max_lrs else None,
        },
        "asked": {
            "train_micro_batch_size_per_gpu": int(args.per_device_train_batch_size),
            "gradient_accumulation_steps": int(args.gradient_accumulation_steps),
            "gradient_clipping": float(args.max_grad_norm),
            "peak_lr": float(args.learning_rate),
        },
        "scheduler": type(scheduler).__name__ if scheduler is not None else type(trainer.lr_scheduler).__name__,
        "optimizer_steps": int(getattr(engine, "global_steps", 0)),
        "trainer_steps": int(trainer.state.global_step),
    }


class _GradientProbe:
    """Adds up, per adapter parameter, the gradients autograd gives it on this rank during a step."""

    def __init__(self, adapters: list[tuple[str, Any]]) -> None:
        self.names = [name for name, _ in adapters]
        self.shapes = {name: tuple(getattr(p, "ds_shape", p.shape)) for name, p in adapters}
        self.local: dict[str, Any] = {}
        self.handles = [p.register_hook(self._hook(name)) for name, p in adapters]

    def _hook(self, name: str) -> Any:
        def add(grad: Any) -> None:
            value = grad.detach().float().clone()
            self.local[name] = value if name not in self.local else self.local[name] + value

        return add

    def step_norms(self, device: Any) -> dict[str, float | None]:
        """The norm of each parameter's gradient averaged over ranks (None: no rank got one). A collective."""
        import torch
        import torch.distributed as dist

        world = dist.get_world_size() if dist.is_initialized() else 1
        parts, present = [], []
        for name in self.names:
            got = self.local.get(name)
            numel = math.prod(self.shapes[name])
            parts.append(torch.zeros(numel, device=device) if got is None else got.reshape(-1).to(device))
            present.append(0.0 if got is None else 1.0)
        flat = torch.cat(parts) if parts else torch.zeros(0, device=device)
        flags = torch.tensor(present, device=device)
        if dist.is_initialized():
            dist.all_reduce(flat)
            dist.all_reduce(flags)
        self.local = {}
        norms: dict[str, float | None] = {}
        offset = 0
        for name, flag in zip(self.names, flags.tolist(), strict=True):
            numel = math.prod(self.shapes[name])
            norms[name] = float((flat[offset : offset + numel] / world).norm()) if flag > 0 else None
            offset += numel
        return norms

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _full_fp32(params: list[tuple[str, Any]]) -> dict[str, Any]:
    from deepspeed.utils import safe_get_full_fp32_param

    found = {}
    for name, param in params:
        value = safe_get_full_fp32_param(param)
        found[name] = None if value is None else value.detach().float().clone()
    return found


def _deepspeed_dropped_on_cpu() -> bool:
    """Whether this accelerate runs the Trainer without DeepSpeed when told to use the CPU (before 1.0 its
    ``PartialState(cpu=True)`` never takes DeepSpeed: the Trainer wraps the model in DDP, its ZeRO-3 weights
    empty). There, not saying ``use_cpu`` lets DeepSpeed's CPU accelerator place the ranks on the CPU."""
    import accelerate
    from packaging.version import Version

    return Version(accelerate.__version__) < Version("1.0")


def train_hf(scenario: Scenario, ctx: RankContext, work: Path, base_dir: Path) -> Trained:
    """Train ``scenario`` (guards already applied) with transformers' ``Trainer``; the same facts as
    the own loop go to ``ctx.facts``."""
    import torch
    from torch.utils.data import DataLoader, Dataset
    from transformers import Trainer, TrainerCallback, TrainingArguments

    # Loaded before the arguments exist (zero_init False) it is whole until deepspeed.initialize;
    # after them, as users mostly do, under ZeRO-3 from_pretrained runs inside deepspeed.zero.Init.
    base = None if scenario.zero_init else adapter_io.load_base(base_dir)
    batch_size = scenario.batch_size or 1  # the trainer has set it from the model size

    def arguments(warmup_steps: int) -> Any:
        return TrainingArguments(
            output_dir=str(work / "trainer"),
            per_device_train_batch_size=batch_size,
            max_steps=ctx.steps,
            gradient_accumulation_steps=scenario.gradient_accumulation_steps,
            warmup_steps=warmup_steps,
            learning_rate=scenario.learning_rate,
            bf16=scenario.bf16,
            use_cpu=ctx.device_type == "cpu" and not _deepspeed_dropped_on_cpu(),
            deepspeed=trainer_deepspeed_config(scenario),
            report_to=[],
            save_strategy="no",
            logging_steps=1,
            disable_tqdm=True,
            dataloader_pin_memory=False,
        )

    # WarmupLR needs at least one warm-up step ("warmup_num_steps must be a positive integer"); transformers
    # 4.43 reads a warm-up of one step as a ratio and refuses it ("warmup_steps must be either 0 or > 1"): two there.
    try:
        args = arguments(1)
    except ValueError as exc:
        if "warmup_steps must be either 0 or > 1" not in str(exc):
            raise
        args = arguments(2)
    model = build_model(scenario, base=base if base is not None else adapter_io.load_base(base_dir))
    ctx.facts["scenario_facts"] = scenario_facts(scenario, model)
    adapters = adapter_parameters(model)
    batch = training_batch(scenario, ctx.rank)
    inputs = model_inputs(batch, labels=True)

    class _FixedBatch(Dataset):
        def __len__(self) -> int:
            return ctx.steps * batch_size * scenario.gradient_accumulation_steps

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {key: value[i % batch_size] for key, value in inputs.items()}

    losses: list[float] = []
    grad_norms: dict[str, list[float | None]] = {name: [] for name, _ in adapters}
    snapshots: dict[str, dict[str, Any]] = {}
    probe = _GradientProbe(adapters)

    class _Measured(Trainer):
        def get_train_dataloader(self) -> Any:
            return DataLoader(_FixedBatch(), batch_size=batch_size, shuffle=False)

        def create_optimizer(self, *a: Any, **kw: Any) -> Any:
            optimizer = super().create_optimizer(*a, **kw)
            if scenario.drop_empty_param_groups:
                # What DeepSpeed does to the optimizer it is given, done before the Trainer builds
                # its scheduler on it (F11).
                optimizer.param_groups[:] = [g for g in optimizer.param_groups if len(g["params"]) > 0]
            return optimizer

        def compute_loss(self, *a: Any, **kw: Any) -> Any:
            loss = super().compute_loss(*a, **kw)
            value = loss[0] if isinstance(loss, tuple) else loss
            losses.append(float(value.detach().float()))
            return loss

    class _Steps(TrainerCallback):
        def on_train_begin(self, *a: Any, **kw: Any) -> None:
            snapshots["before"] = _full_fp32(adapters)
            ctx.meters.training_begins()

        def on_step_begin(self, *a: Any, **kw: Any) -> None:
            ctx.meters.resume()

        def on_step_end(self, *a: Any, **kw: Any) -> None:
            ctx.meters.pause()
            ctx.meters.end_step()
            for name, norm in probe.step_norms(ctx.device).items():
                grad_norms[name].append(norm)

        def on_train_end(self, *a: Any, **kw: Any) -> None:
            snapshots["after"] = _full_fp32(adapters)

    trainer = _Measured(model=model, args=args, train_dataset=_FixedBatch(), callbacks=[_Steps()])
    try:
        trainer.train()
    finally:
        probe.remove()
    ctx.facts["deepspeed_settings"] = deepspeed_settings(trainer)

    ctx.facts["train"] = train_facts(losses, grad_norms, snapshots.get("before", {}), snapshots.get("after", {}))
    return Trained(
        engine="deepspeed",
        wrapped=trainer.model_wrapped,
        model=model,
        batch=torch.as_tensor(batch),
        losses=losses,
        hf_trainer=trainer,
    )
