"""The config grid's axes: what each value of each axis changes in a ``Scenario``. Standard library only.

A combination is one value per axis; ``scenario_overrides`` turns it into ``Scenario`` fields.
Both sides read this table: the orchestrator to validate the matrix's ``grid:`` section and plan
combinations, the rank to build the scenario it trains.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from repros.runtime.registry import Registry

#: Every linear layer of a decoder layer: what DeepSpeed-Chat's own LoRA converts.
DECODER_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

_BUILT_IN: dict[str, dict[str, Mapping[str, Any]]] = {
    # ZeRO-3 partitions every parameter (persistence threshold 0), as it does a real model's large ones.
    "engine": {
        "deepspeed-zero2": {"engine": "deepspeed", "zero_stage": 2},
        "deepspeed-zero3": {"engine": "deepspeed", "zero_stage": 3, "zero3_persistence_threshold": 0},
        "fsdp2": {"engine": "fsdp2"},
        "ddp": {"engine": "ddp"},
    },
    "adapter": {
        "lora": {"adapter": "lora"},
        "dora": {"adapter": "dora"},
        "qlora-8bit": {"adapter": "lora", "quantization": "int8"},
        "qlora-4bit": {"adapter": "lora", "quantization": "nf4"},
        "dschat-lora": {"lora_impl": "dschat", "target_modules": DECODER_LINEARS},
    },
    # How the adapter is attached: a PeftModel, or the HF model's own add_adapter (a raw HF model).
    "attach": {
        "peft-model": {"peft_wrapping": "peft_model"},
        "add-adapter": {"peft_wrapping": "add_adapter"},
    },
    "checkpointing": {
        "off": {"gradient_checkpointing": False},
        "reentrant": {"gradient_checkpointing": True, "use_reentrant": True},
        "non-reentrant": {"gradient_checkpointing": True, "use_reentrant": False},
        "default": {"gradient_checkpointing": True, "use_reentrant": None},
    },
    "dtype": {
        "bf16": {"bf16": True},
        "fp32": {"bf16": False},
    },
    # What users do after training: save the adapter and load it back, merge it, sync it by name.
    "after": {
        "none": {"after_training": "none"},
        "save-reload": {"after_training": "save-reload"},
        "merge": {"after_training": "merge"},
        "sync": {"after_training": "sync", "sync_weights": True},
    },
}
#: Every axis, by name, its values each a change to a ``Scenario`` (``repros/runtime/registry.py``).
AXES: Registry[dict[str, Mapping[str, Any]]] = Registry("config-grid axis", _BUILT_IN)
AXIS_ORDER = tuple(AXES)


def validate(combination: Mapping[str, str]) -> None:
    """Raise ``ValueError`` naming the first axis or value that is not in the table."""
    for axis, value in combination.items():
        if axis not in AXES:
            raise ValueError(f"unknown axis {axis!r}; known: {', '.join(AXES)}")
        if value not in AXES[axis]:
            raise ValueError(f"unknown value {value!r} of axis {axis}; known: {', '.join(AXES[axis])}")


def scenario_overrides(combination: Mapping[str, str]) -> dict[str, Any]:
    validate(combination)
    overrides: dict[str, Any] = {}
    for axis in AXIS_ORDER:
        if axis in combination:
            overrides.update(AXES[axis][combination[axis]])
    return overrides


def combination_id(combination: Mapping[str, str]) -> str:
    """A stable, readable id for a combination (it names the item's directory)."""
    return "+".join(combination[axis] for axis in AXIS_ORDER if axis in combination)
