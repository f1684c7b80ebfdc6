"""Train one strategy on the item's ranks, or the one-process reference, step by step, and keep what
``crosscheck`` compares: each step's loss, gradient norm, every trainable tensor's gradient and weight, and
how many optimizer steps were really taken.

Both train the same adapter: the test model drawn from the same seed, the same adapter, the same ordered
data. At each step the global batch is ``world × micro_batches`` micro-batches (each a different draw of the
seed); rank ``r`` trains micro-batches ``r·k .. r·k + k - 1``, the reference all of them in one forward.

The reference is one process, no wrapper, no checkpointing, no accumulation; its numbers are computed in the
strategy's regime (``Strategy.regime``): float32; bf16 autocast over float32 weights; or the model cast to
bf16 with float32 master weights in the optimizer (DeepSpeed's bf16, FSDP2's mixed precision), so that a
strategy is held to what its precision allows and no more.

Heavy imports stay inside functions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any

from repros.runtime.context import RankContext
from repros.trainer.crosscheck.strategy import LEARNING_RATES, Strategy
from repros.trainer.scenario import Scenario

#: The rows of each micro-batch and the tokens of each row.
MICRO_BATCH_ROWS = 2
SEQUENCE_LENGTH = 16
#: The adapter every strategy trains: LoRA (or DoRA) of rank 16 on every projection of attention and MLP,
#: so that both shapes of adapter matrix (hidden x r and r x hidden, and the narrower key/value ones) are in.
ADAPTER_RANK = 16
ADAPTER_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class Trajectory:
    """What one training run did, step by step (full float32 tensors, on the CPU)."""

    #: The global batch's loss per step (the mean over every rank's micro-batches).
    losses: list[float] = field(default_factory=list)
    #: The norm of the whole trainable gradient per step, as it was when the optimizer was asked to step.
    grad_norms: list[float] = field(default_factory=list)
    #: Optimizer steps really taken, counted after each step (a skipped step does not count).
    optimizer_steps: list[int] = field(default_factory=list)
    gradients: list[dict[str, Any]] = field(default_factory=list)
    weights: list[dict[str, Any]] = field(default_factory=list)
    initial: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Breakage:
    """A deliberate fault put into the strategy (never the reference), to prove the comparison catches it:
    ``grad-half`` every gradient halved; ``drop-micro-batch`` one micro-batch of rank 0 at step 1 contributes
    nothing; ``skip-step`` the optimizer step of step 1 not taken; ``unsaved-tensor`` one adapter tensor left
    out of the saved adapter."""

    kind: str | None = None

    KINDS = ("grad-half", "drop-micro-batch", "skip-step", "unsaved-tensor")

    def loss_scale(self, step: int, rank: int, micro: int) -> float:
        if self.kind == "grad-half":
            return 0.5
        if self.kind == "drop-micro-batch" and (step, rank, micro) == (1, 0, 0):
            return 0.0
        return 1.0

    def skips(self, step: int) -> bool:
        return self.kind == "skip-step" and step == 1


def micro_batch(seed: int, step: int, index: int) -> Any:
    """Micro-batch ``index`` of the global batch of ``step``: a fixed draw of ``seed``."""
    from repros.trainer.tiny_models import fixed_batch

    return fixed_batch(0, MICRO_BATCH_ROWS, SEQUENCE_LENGTH, seed=1_000_003 * (seed + 1) + 1009 * step + index)


def scenario_of(strategy: Strategy, seed: int, *, engine: str | None = None) -> Scenario:
    """The fixed trainer's scenario that trains ``strategy`` as its library documents it."""
    return Scenario(
        engine=engine or strategy.engine,
        zero_stage=strategy.stage if strategy.stage is not None else 0,
        bf16=strategy.precision == "bf16",
        adapter=strategy.adapter,
        gradient_checkpointing=strategy.checkpointing != "none",
        use_reentrant=strategy.checkpointing == "reentrant",
        # FSDP1 with a LoRA: the original parameters kept (its default flat parameters refuse a unit that
        # mixes frozen and trainable ones), each decoder layer a unit.
        fsdp1_use_orig_params=True,
        fsdp1_wrap="layer",
        # FSDP2's mixed precision on the root as on the layers, as FSDP2's recipes shard a model.
        fsdp_root_mixed_precision=True,
        gradient_accumulation_steps=strategy.micro_batches if strategy.accumulation == "engine" else 1,
        manual_accumulation=strategy.micro_batches if strategy.accumulation == "manual" else 1,
        # By hand under DeepSpeed, as it documents such a loop: the boundary said (F35 where it is not).
        deepspeed_accumulation_boundary=strategy.engine == "deepspeed" and strategy.accumulation == "manual",
        optimizer=strategy.optimizer,
        seed=seed,
        lora_r=ADAPTER_RANK,
        lora_alpha=2 * ADAPTER_RANK,
        target_modules=ADAPTER_TARGETS,
        learning_rate=LEARNING_RATES[strategy.optimizer],
        batch_size=MICRO_BATCH_ROWS,
        seq_len=SEQUENCE_LENGTH,
    )


def build(scenario: Scenario) -> Any:
    """The test model drawn from the scenario's seed, its adapter attached, checkpointing as it says."""
    from repros.trainer.model import build_model

    return build_model(scenario)


# --------------------------------------------------------------------------- the reference


class _MasterWeights:
    """One process with the model cast to bf16 and float32 master copies of the adapter in the optimizer:
    what DeepSpeed's bf16 and FSDP2's mixed precision train, without their sharding or communication."""

    def __init__(self, scenario: Scenario, model: Any) -> None:
        import torch

        from repros.trainer.fixed_trainer import make_optimizer
        from repros.trainer.model import adapter_parameters

        self.model = model.to(torch.bfloat16)
        self.adapters = adapter_parameters(self.model)
        self.master = {name: p.detach().float().clone().requires_grad_(True) for name, p in self.adapters}
        self.client_optimizer = make_optimizer(scenario, list(self.master.values()))

    def forward(self, batch: Any) -> Any:
        from repros.trainer.tiny_models import model_inputs

        return self.model(**model_inputs(batch, labels=True)).loss

    def backward(self, loss: Any) -> None:
        loss.backward()

    def full_grads(self) -> dict[str, Any]:
        return {name: None if p.grad is None else p.grad.detach().float().clone() for name, p in self.adapters}

    def full_params(self) -> dict[str, Any]:
        return {name: value.detach().clone() for name, value in self.master.items()}

    def step(self) -> None:
        import torch

        for name, p in self.adapters:
            self.master[name].grad = None if p.grad is None else p.grad.detach().float()
        self.client_optimizer.step()
        self.client_optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for name, p in self.adapters:
                p.copy_(self.master[name])
                p.grad = None


class _Plain:
    """One process, the fixed trainer's engine of no wrapper (float32, or bf16 autocast)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.adapters = engine.adapters()
        self.client_optimizer = engine.client_optimizer

    def forward(self, batch: Any) -> Any:
        return self.engine.forward(batch)

    def backward(self, loss: Any) -> None:
        self.engine.backward(loss)

    def full_grads(self) -> dict[str, Any]:
        return dict(self.engine.full_grads(self.adapters))

    def full_params(self) -> dict[str, Any]:
        return dict(self.engine.full_params(self.adapters))

    def step(self) -> None:
        self.engine.step()


def train_reference(strategy: Strategy, ctx: RankContext, seed: int, steps: int, world: int) -> tuple[Trajectory, Any]:
    """The one-process reference of ``strategy`` (``world`` ranks' global batch in one forward); no
    collective is taken, so one rank can run it while the others wait. Returns the trajectory and the
    trained model (float32 master weights are what the trajectory holds)."""
    import torch

    from repros.trainer.fixed_trainer import _ENGINES, StepCounter

    reference = replace(strategy, engine="single", stage=None, checkpointing="none", accumulation="none")
    scenario = scenario_of(reference, seed)
    if strategy.regime == "bf16-weights":
        scenario = replace(scenario, bf16=False)
    model = build(scenario)
    if strategy.regime == "bf16-weights":
        runner: Any = _MasterWeights(scenario, model)
    else:
        runner = _Plain(_ENGINES["single"](scenario, ctx, model))
    count = StepCounter(runner.client_optimizer)
    trajectory = Trajectory(initial=runner.full_params())
    batches = strategy.micro_batches * world
    for step in range(steps):
        batch = torch.cat([micro_batch(seed, step, i) for i in range(batches)]).to(ctx.device)
        loss = runner.forward(batch)
        runner.backward(loss)
        grads = runner.full_grads()
        runner.step()
        _record(trajectory, float(loss.detach().float()), grads, runner.full_params(), count.taken)
    return trajectory, model


# --------------------------------------------------------------------------- a strategy on the ranks


@contextmanager
def _skipping_next_step(optimizer: Any) -> Iterator[None]:
    """The optimizer's next ``step`` does nothing (a deliberate fault: the step's hooks do not run either)."""
    original = optimizer.step

    def skipped(*args: Any, **kwargs: Any) -> None:
        optimizer.step = original
        return None

    optimizer.step = skipped
    try:
        yield
    finally:
        optimizer.step = original


def _accumulating(strategy: Strategy, engine: Any, last: bool) -> Any:
    """What surrounds a micro-batch's forward and backward so the engine accumulates as the strategy says:
    by the engine (DDP and FSDP1 ``no_sync``, FSDP2 ``set_requires_gradient_sync``; DeepSpeed counts its
    own micro-steps), or by hand (every micro-batch reduced; DeepSpeed told where the step's boundary is with
    ``set_gradient_accumulation_boundary``, as it documents for a loop that calls ``backward`` several times
    per ``step``, where the scenario says so: ``Scenario.deepspeed_accumulation_boundary``)."""
    wrapped = engine.wrapped
    if strategy.engine == "deepspeed":
        if strategy.accumulation == "manual" and engine.scenario.deepspeed_accumulation_boundary:
            wrapped.set_gradient_accumulation_boundary(last)
        return nullcontext()
    if strategy.accumulation != "engine" or last:
        if strategy.engine == "fsdp2" and strategy.accumulation == "engine":
            wrapped.set_requires_gradient_sync(True)
        return nullcontext()
    if strategy.engine == "fsdp2":
        wrapped.set_requires_gradient_sync(False)
        return nullcontext()
    if strategy.engine in ("ddp", "fsdp1"):
        return wrapped.no_sync()
    return nullcontext()


def _backward(strategy: Strategy, engine: Any, loss: Any, scale: float) -> None:
    """The micro-batch's backward, its loss scaled to the global batch's mean: by hand (``1/k``), except
    where DeepSpeed accumulates and divides by its own ``gradient_accumulation_steps``."""
    if strategy.engine == "deepspeed" and strategy.accumulation == "engine":
        engine.backward(loss * scale)
    else:
        engine.backward(loss * (scale / strategy.micro_batches))


def train_strategy(
    strategy: Strategy,
    ctx: RankContext,
    seed: int,
    steps: int,
    breakage: Breakage | None = None,
    overrides: Callable[[Scenario], Scenario] | None = None,
) -> tuple[Trajectory, Any]:
    """Train ``strategy`` on every rank of the item (a collective: each rank calls it). Returns the trajectory
    (full tensors on every rank) and the fixed trainer's engine (for saving). ``overrides`` changes the
    scenario further (a documented failure's configuration, or the fixed trainer's guards)."""
    import torch
    import torch.distributed as dist

    from repros.trainer.fixed_trainer import _ENGINES, StepCounter, require_packages
    from repros.trainer.model import scenario_facts

    breakage = breakage or Breakage()
    scenario = scenario_of(strategy, seed)
    if overrides is not None:
        scenario = overrides(scenario)
    require_packages(scenario)
    model = build(scenario)
    # What a documented failure's signature reads of the run (F5's: a frozen embedding under reentrant
    # checkpointing), beneath the strategy's own parts.
    ctx.facts["scenario_facts"] = {**scenario_facts(scenario, model), **ctx.facts.get("scenario_facts", {})}
    engine = _ENGINES[scenario.engine](scenario, ctx, model)
    adapters = engine.adapters()
    count = StepCounter(engine.client_optimizer)
    trajectory = Trajectory(initial=engine.full_params(adapters))
    k = strategy.micro_batches
    engine.wrapped.train()
    ctx.meters.training_begins()
    for step in range(steps):
        total = torch.zeros((), dtype=torch.float64)
        ctx.meters.resume()
        for j in range(k):
            last = j == k - 1
            batch = micro_batch(seed, step, ctx.rank * k + j).to(ctx.device)
            with _accumulating(strategy, engine, last):
                loss = engine.forward(batch)
                _backward(strategy, engine, loss, breakage.loss_scale(step, ctx.rank, j))
            total += float(loss.detach().float())
            if strategy.engine == "deepspeed" and strategy.accumulation == "engine" and not last:
                engine.step()  # DeepSpeed counts the micro-step; its optimizer steps at the boundary
        ctx.meters.pause()
        grads = engine.full_grads(adapters)  # a collective under ZeRO and FSDP: untimed, on every rank
        ctx.meters.resume()
        with _skipping_next_step(engine.client_optimizer) if breakage.skips(step) else nullcontext():
            engine.step()
        ctx.meters.pause()
        ctx.meters.end_step()
        if dist.is_initialized():
            dist.all_reduce(total)
        mean = float(total) / (k * (dist.get_world_size() if dist.is_initialized() else 1))
        _record(trajectory, mean, grads, engine.full_params(adapters), count.taken)
    return trajectory, engine


def _record(trajectory: Trajectory, loss: float, grads: dict[str, Any], weights: dict[str, Any], taken: int) -> None:
    import math

    squares = sum(float(g.double().pow(2).sum()) for g in grads.values() if g is not None)
    trajectory.losses.append(loss)
    trajectory.grad_norms.append(math.sqrt(squares) if math.isfinite(squares) else squares)
    trajectory.gradients.append({n: None if g is None else g.cpu() for n, g in grads.items()})
    trajectory.weights.append({n: None if w is None else w.cpu() for n, w in weights.items()})
    trajectory.optimizer_steps.append(taken)


def width(model: Any) -> int:
    """The widest reduction inside one of the model's layers (its hidden or MLP width)."""
    config = getattr(model, "config", None)
    base = getattr(getattr(model, "base_model", None), "model", None)
    config = getattr(base, "config", config)
    return int(max(getattr(config, "hidden_size", 1), getattr(config, "intermediate_size", 1)))


def tokens_per_step(world: int, strategy: Strategy) -> int:
    """The tokens one optimizer step's loss averages (every rank's micro-batches; a causal LM predicts all
    but the first token of a row)."""
    return world * strategy.micro_batches * MICRO_BATCH_ROWS * (SEQUENCE_LENGTH - 1)


def names_in_order(trajectories: Sequence[Trajectory]) -> list[str]:
    names: list[str] = []
    for trajectory in trajectories:
        for name in trajectory.initial:
            if name not in names:
                names.append(name)
    return names
