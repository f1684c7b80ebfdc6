"""DeepSpeed-Chat's own LoRA layers, as its training scripts used them (no PEFT).

``convert_linear_layer_to_lora`` replaces each matching ``nn.Linear`` with a layer that
keeps the original (frozen) weight and adds two trainable low-rank factors;
``only_optimize_lora_parameters`` freezes everything else, the embedding included. That is
DeepSpeed-Chat's ``--lora_dim N --only_optimize_lora`` (DeepSpeedExamples
``dschat/utils/module/lora.py``), written here from its behaviour.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

LORA_PARAMETER_NAMES = ("lora_right_weight", "lora_left_weight")


def _lora_linear_class() -> Any:
    import torch
    from torch import nn
    from torch.nn import functional as F

    class LinearLayerLoRA(nn.Module):
        """``y = x W^T + b + scaling * (x R) L`` with ``W`` and ``b`` frozen."""

        def __init__(self, weight: Any, lora_dim: int, lora_scaling: float = 1.0, bias: Any = None) -> None:
            super().__init__()
            if lora_dim <= 0:
                raise ValueError("lora_dim must be positive")
            self.weight = weight
            self.bias = bias
            rows, columns = weight.shape
            self.lora_right_weight = nn.Parameter(torch.zeros(columns, lora_dim, dtype=weight.dtype))
            self.lora_left_weight = nn.Parameter(torch.zeros(lora_dim, rows, dtype=weight.dtype))
            self.lora_scaling = lora_scaling / lora_dim
            nn.init.kaiming_uniform_(self.lora_right_weight, a=math.sqrt(5))
            nn.init.zeros_(self.lora_left_weight)
            self.weight.requires_grad = False

        def forward(self, x: Any) -> Any:
            base = F.linear(x, self.weight, self.bias)
            return base + (x @ self.lora_right_weight @ self.lora_left_weight) * self.lora_scaling

    return LinearLayerLoRA


def convert_linear_layer_to_lora(model: Any, target_modules: Iterable[str], lora_dim: int) -> Any:
    """Replace every ``nn.Linear`` whose name ends with one of ``target_modules`` (a name's last component,
    as DeepSpeed-Chat matches; or its full module name, as the ``family-target-modules`` guard resolves a VLM's)."""
    from torch import nn

    lora_linear = _lora_linear_class()
    targets = tuple(target_modules)
    names = [
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and (name.rsplit(".", 1)[-1] in targets or name in targets)
    ]
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        linear = getattr(parent, child)
        setattr(parent, child, lora_linear(linear.weight, lora_dim, bias=linear.bias))
    return model


def only_optimize_lora_parameters(model: Any) -> Any:
    for name, param in model.named_parameters():
        param.requires_grad = name.rsplit(".", 1)[-1] in LORA_PARAMETER_NAMES
    return model
