"""transformers 5.0 .. 5.5.3's shared ``rotary_fn`` child, left out as transformers PR #45414 does (F18).

``use_kernelized_func(apply_rotary_pos_emb)`` sets ``self.rotary_fn`` on every attention module at the
end of its ``__init__``; with the ``kernels`` package installed ``apply_rotary_pos_emb`` is one
``nn.Module`` per process, so every model built in the process holds that same module as a child, and
the attention's forward calls it. Under ZeRO-3 each engine registers hooks and a module id on it; the
last engine built (a reference model's) owns the id the policy's trace looks it up by. From 5.5.4 on
transformers does not attach it under ZeRO-3; ``drop_kernel_func_children`` does the same for every
model built afterwards in this process (its ``post_init``, which every model's ``__init__`` ends with).
"""

from __future__ import annotations

from typing import Any

#: The attribute transformers attaches (``use_kernelized_func`` hard-codes it).
CHILD = "rotary_fn"

_patched = False


def strip(model: Any) -> int:
    """Remove every ``rotary_fn`` child of ``model``'s modules; how many there were."""
    found = 0
    for module in model.modules():
        if CHILD in module._modules:
            del module._modules[CHILD]
            found += 1
    return found


def drop_kernel_func_children() -> None:
    """Every transformers model built from now on in this process keeps no ``rotary_fn`` child."""
    global _patched
    if _patched:
        return
    from transformers import PreTrainedModel

    original = PreTrainedModel.post_init

    def post_init(self: Any) -> Any:
        strip(self)
        return original(self)

    setattr(PreTrainedModel, "post_init", post_init)  # noqa: B010 - a library method replaced
    _patched = True
