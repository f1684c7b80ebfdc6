"""torch's FSDP2 (``fully_shard``) under the names each torch release gives it.

torch 2.4-2.5 ship it as ``torch.distributed._composable.fsdp``; 2.6 and later export it
from ``torch.distributed.fsdp``.
"""

from __future__ import annotations

from typing import Any


def _module() -> Any:
    try:
        from torch.distributed import fsdp

        if hasattr(fsdp, "fully_shard"):
            return fsdp
    except ImportError:
        pass
    from torch.distributed._composable import fsdp as composable

    return composable


def fully_shard(module: Any, **kwargs: Any) -> Any:
    return _module().fully_shard(module, **kwargs)


def mixed_precision_policy(dtype: Any) -> Any:
    """Parameters and compute in ``dtype``; gradients reduced in float32."""
    import torch

    return _module().MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
