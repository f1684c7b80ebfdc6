"""A training strategy, as ``crosscheck`` names it: how the same adapter is trained (engine, ZeRO stage,
precision, activation checkpointing, gradient accumulation, adapter, optimizer), and what one process must
train alike.

Standard library only: the orchestrator plans strategies from these declarations, the ranks train them.

A strategy's name is stable and says every part that is not the default, in a fixed order::

    <engine>-<precision>[-ckpt-re|-ckpt-nr][-accum-engine|-accum-manual][-dora][-<optimizer>]

``<engine>`` is ``single`` (one process, no wrapper), ``ddp``, ``zero0`` ... ``zero3`` (DeepSpeed's ZeRO stages),
``fsdp1`` or ``fsdp2``; ``<precision>`` ``fp32`` or ``bf16``. ``zero2-bf16-ckpt-nr-accum-manual`` is ZeRO-2 in
bf16 with non-reentrant checkpointing, the micro-batches accumulated by hand, a LoRA adapter and plain SGD;
``fsdp2-fp32-dora-adamw`` FSDP2 in float32 training a DoRA adapter with AdamW.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

#: The engines and how a name spells each (a DeepSpeed engine is spelled by its ZeRO stage).
ENGINES = ("single", "ddp", "deepspeed", "fsdp1", "fsdp2")
ZERO_STAGES = (0, 1, 2, 3)
PRECISIONS = ("fp32", "bf16")
CHECKPOINTING = ("none", "reentrant", "non-reentrant")
ACCUMULATION = ("none", "engine", "manual")
ADAPTERS = ("lora", "dora")
#: ``sgd``: torch's plain SGD (the default: a difference of a gradient reaches the weights in proportion, so the
#: comparison of weights is as sharp as that of gradients); ``adamw``: torch's AdamW; ``adamw8bit``:
#: bitsandbytes' AdamW8bit (8-bit state for a tensor of at least 4096 elements, as the optimizer sees it).
OPTIMIZERS = ("sgd", "adamw", "adamw8bit")
#: Each optimizer's learning rate.
LEARNING_RATES = {"sgd": 0.1, "adamw": 1e-2, "adamw8bit": 1e-2}

#: How many micro-batches one optimizer step accumulates, where a strategy accumulates.
MICRO_BATCHES_ACCUMULATED = 2

_CKPT_TOKENS = {"reentrant": "ckpt-re", "non-reentrant": "ckpt-nr"}
_ACCUM_TOKENS = {"engine": "accum-engine", "manual": "accum-manual"}


class UnknownStrategy(ValueError):
    """A strategy name that does not parse, or names a combination that does not exist."""


@dataclass(frozen=True, order=True)
class Strategy:
    engine: str
    #: The ZeRO stage (DeepSpeed only), else None.
    stage: int | None
    precision: str = "fp32"
    checkpointing: str = "none"
    accumulation: str = "none"
    adapter: str = "lora"
    optimizer: str = "sgd"

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise UnknownStrategy(f"unknown engine {self.engine!r}; known: {', '.join(ENGINES)}")
        if (self.engine == "deepspeed") != (self.stage is not None):
            raise UnknownStrategy("a ZeRO stage goes with the deepspeed engine, and only with it")
        if self.stage is not None and self.stage not in ZERO_STAGES:
            raise UnknownStrategy(f"unknown ZeRO stage {self.stage}; known: {ZERO_STAGES}")
        for value, known, what in (
            (self.precision, PRECISIONS, "precision"),
            (self.checkpointing, CHECKPOINTING, "checkpointing"),
            (self.accumulation, ACCUMULATION, "accumulation"),
            (self.adapter, ADAPTERS, "adapter"),
            (self.optimizer, OPTIMIZERS, "optimizer"),
        ):
            if value not in known:
                raise UnknownStrategy(f"unknown {what} {value!r}; known: {', '.join(known)}")
        if self.engine == "single" and self.accumulation == "engine":
            raise UnknownStrategy("one process has no engine to accumulate for it: use accum-manual")

    # ------------------------------------------------------------------ names

    @property
    def engine_token(self) -> str:
        return f"zero{self.stage}" if self.engine == "deepspeed" else self.engine

    @property
    def name(self) -> str:
        parts = [self.engine_token, self.precision]
        if self.checkpointing != "none":
            parts.append(_CKPT_TOKENS[self.checkpointing])
        if self.accumulation != "none":
            parts.append(_ACCUM_TOKENS[self.accumulation])
        if self.adapter != "lora":
            parts.append(self.adapter)
        if self.optimizer != "sgd":
            parts.append(self.optimizer)
        return "-".join(parts)

    def parts(self) -> dict[str, str | int | None]:
        """What records carry as ``strategy_parts``."""
        return asdict(self)

    # ------------------------------------------------------------------ what it takes

    @property
    def adaptive(self) -> bool:
        """Whether its optimizer normalises each element's step (AdamW and its 8-bit form)."""
        return self.optimizer != "sgd"

    @property
    def world_size(self) -> int | None:
        """The ranks it trains on: one for ``single``, else the cell's (None)."""
        return 1 if self.engine == "single" else None

    @property
    def micro_batches(self) -> int:
        """Micro-batches per optimizer step on each rank."""
        return MICRO_BATCHES_ACCUMULATED if self.accumulation != "none" else 1

    def packages(self) -> dict[str, str]:
        """The packages it needs beyond torch, transformers and peft, each with why."""
        needed: dict[str, str] = {}
        if self.engine == "deepspeed":
            needed["deepspeed"] = f"ZeRO-{self.stage}"
        if self.optimizer == "adamw8bit":
            needed["bitsandbytes"] = "AdamW8bit"
        return needed

    @property
    def regime(self) -> str:
        """How its numbers are computed, which the one-process reference it is compared with shares:
        ``fp32``; ``bf16-autocast`` (float32 weights, bf16 compute: DDP, FSDP1 and one process under autocast;
        FSDP2, whose mixed-precision policy casts float32 shards to bf16 for compute); ``bf16-weights`` (the
        model cast to bf16, float32 master weights rounded from it in the optimizer: DeepSpeed)."""
        if self.precision == "fp32":
            return "fp32"
        return "bf16-weights" if self.engine == "deepspeed" else "bf16-autocast"


def parse(name: str) -> Strategy:
    """The strategy a name spells (the inverse of ``Strategy.name``)."""
    tokens = name.strip().split("-")
    if len(tokens) < 2:
        raise UnknownStrategy(f"{name!r} is not <engine>-<precision>[-...], e.g. zero3-bf16-ckpt-nr")
    head, precision, rest = tokens[0], tokens[1], tokens[2:]
    if head.startswith("zero") and head[4:].isdigit():
        engine, stage = "deepspeed", int(head[4:])
    else:
        engine, stage = head, None
    fields: dict[str, str] = {}
    i = 0
    while i < len(rest):
        pair = "-".join(rest[i : i + 2])
        if pair in _CKPT_TOKENS.values() and "checkpointing" not in fields:
            fields["checkpointing"] = next(k for k, v in _CKPT_TOKENS.items() if v == pair)
            i += 2
        elif pair in _ACCUM_TOKENS.values() and "accumulation" not in fields:
            fields["accumulation"] = next(k for k, v in _ACCUM_TOKENS.items() if v == pair)
            i += 2
        elif rest[i] in ADAPTERS and "adapter" not in fields:
            fields["adapter"] = rest[i]
            i += 1
        elif rest[i] in OPTIMIZERS and "optimizer" not in fields:
            fields["optimizer"] = rest[i]
            i += 1
        else:
            raise UnknownStrategy(f"{name!r}: {rest[i]!r} is not a part of a strategy name")
    strategy = Strategy(engine=engine, stage=stage, precision=precision, **fields)
    if strategy.name != name.strip():
        raise UnknownStrategy(f"{name!r} is written out of order; its name is {strategy.name!r}")
    return strategy


def from_parts(parts: Mapping[str, object]) -> Strategy:
    stage = parts.get("stage")
    return Strategy(
        engine=str(parts["engine"]),
        stage=int(str(stage)) if stage is not None else None,
        precision=str(parts.get("precision", "fp32")),
        checkpointing=str(parts.get("checkpointing", "none")),
        accumulation=str(parts.get("accumulation", "none")),
        adapter=str(parts.get("adapter", "lora")),
        optimizer=str(parts.get("optimizer", "sgd")),
    )


#: The axes a strategy varies along, as the planner covers them: the engine (with its stage) first.
ENGINE_TOKENS = ("single", "ddp", "zero0", "zero1", "zero2", "zero3", "fsdp1", "fsdp2")
AXES: dict[str, tuple[str, ...]] = {
    "engine": ENGINE_TOKENS,
    "precision": PRECISIONS,
    "checkpointing": CHECKPOINTING,
    "accumulation": ACCUMULATION,
    "adapter": ADAPTERS,
    "optimizer": OPTIMIZERS,
}


def from_axes(values: Mapping[str, str]) -> Strategy:
    """The strategy of one value per axis (``AXES``)."""
    token = values["engine"]
    engine, stage = ("deepspeed", int(token[4:])) if token.startswith("zero") else (token, None)
    return Strategy(
        engine=engine,
        stage=stage,
        precision=values.get("precision", "fp32"),
        checkpointing=values.get("checkpointing", "none"),
        accumulation=values.get("accumulation", "none"),
        adapter=values.get("adapter", "lora"),
        optimizer=values.get("optimizer", "sgd"),
    )


def valid(values: Mapping[str, str]) -> bool:
    try:
        from_axes(values)
    except UnknownStrategy:
        return False
    return True


def matching(patterns: Iterable[str], candidates: Iterable[Strategy]) -> list[Strategy]:
    """The candidates whose names match any of ``patterns`` (shell-style: ``zero*-fp32``), in order."""
    wanted = list(patterns)
    return [s for s in candidates if any(fnmatch.fnmatchcase(s.name, p) for p in wanted)]


#: How a divergence's message begins: ``<strategy> trains unlike one process: ...`` (``check.py``).
DIVERGENCE_SAYS = " trains unlike one process: "


def diverged_strategy(message: str) -> Strategy | None:
    """The strategy a divergence's message names at its start, or None (another message)."""
    name, said, _ = message.strip().partition(DIVERGENCE_SAYS)
    if not said:
        return None
    try:
        return parse(name)
    except UnknownStrategy:
        return None
