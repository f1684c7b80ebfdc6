"""PEFT's torchao dispatcher, consulted only where a layer's weight is a torchao tensor (F30's guard).

PEFT's LoRA picks a layer class by running a list of dispatchers in order (bitsandbytes, EETQ, AQLM,
AWQ, GPTQ, HQQ, INC, torchao, Megatron, the default), the first that returns a module winning. A plain
``nn.Linear`` falls through to the torchao one, which in PEFT before 0.19.0 imports
``torchao.quantization.LinearActivationQuantizedTensor`` (for an ``isinstance`` check) whenever torchao
is installed; torchao 0.18.0 removed that class, so every plain linear layer raises ``ImportError`` and
16-bit LoRA cannot be created at all, while QLoRA's layers match bitsandbytes' dispatcher first and never
get there. PEFT 0.19.0 checks ``torchao.utils.TorchAOBaseTensor`` instead.

``check_torchao_dispatch`` wraps PEFT's dispatcher so that it runs only for a weight that is a torchao
tensor (torchao's base class, in every release the guard applies to) and returns nothing otherwise, as
PEFT 0.19.0's does: a layer torchao quantized still gets PEFT's torchao LoRA layer. Heavy imports stay
inside functions.
"""

from __future__ import annotations

from typing import Any

_PATCHED = "_ft_regress_torchao_checked"


def _is_torchao_weight(target: Any) -> bool:
    from torchao.utils import TorchAOBaseTensor

    base = target.get_base_layer() if hasattr(target, "get_base_layer") else target
    return isinstance(getattr(base, "weight", None), TorchAOBaseTensor)


def check_torchao_dispatch() -> bool:
    """Make PEFT's LoRA consult its torchao dispatcher only for torchao weights; True where it was patched
    (False: PEFT has no such dispatcher in its LoRA model module)."""
    from peft.tuners.lora import model as lora_model

    original = getattr(lora_model, "dispatch_torchao", None)
    if original is None:
        return False
    if getattr(original, _PATCHED, False):
        return True

    def dispatch_torchao(target: Any, adapter_name: str, *args: Any, **kwargs: Any) -> Any:
        if not _is_torchao_weight(target):
            return None
        return original(target, adapter_name, *args, **kwargs)

    setattr(dispatch_torchao, _PATCHED, True)
    lora_model.dispatch_torchao = dispatch_torchao
    return True
