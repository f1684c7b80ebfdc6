"""ZeRO-3's gathers made safe from outside: the coalesced all-gather waited on in full (the
``zero3-wait-every-gather`` guard, F17), a gather handle's wait made idempotent (the
``zero3-gather-handles-wait-once`` guard, F22), and a check that a gather delivered every parameter
whole (F17).

Before DeepSpeed PR #8539 (first in 0.19.8), ``Init._allgather_params_coalesced`` launches one
async all-gather per parameter and waits only on the last handle before pointing each
``param.data`` at its (``torch.empty``) gather buffer. On a CUDA stream the gathers run in order,
so the last one finishing means all did; on gloo each runs on a thread of its own with no order
between them, and the CPU accelerator's ``synchronize()`` does nothing, so a parameter can be read
before its gather arrived: uninitialized memory (NaN, 1e+37, zeros) or the previous bytes.

The guard does what the PR does, from outside: it wraps the function, records every handle the
``deepspeed.comm`` all-gathers return while it runs, and waits on each of them before returning.
The parameters are only read after it returns, so waiting there is as good as waiting inside.
"""

from __future__ import annotations

import threading
from typing import Any

#: The ``deepspeed.comm`` calls whose handles the coalesced gather launches (and drops but the last).
_GATHERS = ("all_gather_into_tensor", "all_gather")
_MARK = "_ft_regress_waits_on_every_gather"
_installing = threading.Lock()


def wait_on_every_gather() -> bool:
    """Install the guard (once per process); False where it already was."""
    import deepspeed.runtime.zero.partition_parameters as zero3

    with _installing:
        original = zero3.Init._allgather_params_coalesced
        if getattr(original, _MARK, False):
            return False

        def waiting_on_every_gather(self: Any, param_list: Any, *args: Any, **kwargs: Any) -> Any:
            comm = zero3.dist
            launched: list[Any] = []
            saved = {name: getattr(comm, name) for name in _GATHERS}

            def recording(call: Any) -> Any:
                def launch(*a: Any, **k: Any) -> Any:
                    handle = call(*a, **k)
                    if handle is not None:
                        launched.append(handle)
                    return handle

                return launch

            for name, call in saved.items():
                setattr(comm, name, recording(call))
            try:
                result = original(self, param_list, *args, **kwargs)
            finally:
                for name, call in saved.items():
                    setattr(comm, name, call)
            for handle in launched:
                handle.wait()
            return result

        setattr(waiting_on_every_gather, _MARK, True)
        zero3.Init._allgather_params_coalesced = waiting_on_every_gather
        return True


_WAITED = "_ft_regress_waited"


def gather_handles_wait_once() -> bool:
    """Make a second ``wait()`` of a single-parameter gather handle do nothing, as DeepSpeed PR #8487
    (0.19.7) does: before it, the coordinator waits one handle once per parameter it was registered
    under, and a late wait marks a parameter already released (``data`` empty) AVAILABLE again.
    Installed once per process; False where it already was."""
    import deepspeed.runtime.zero.partition_parameters as zero3

    installed = False
    with _installing:
        for cls in (zero3.AllGatherHandle, zero3.NoGatherHandle):
            original = cls.wait
            if getattr(original, _MARK, False):
                continue

            def wait_once(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
                if getattr(self, _WAITED, False):
                    return None
                result = _original(self, *args, **kwargs)
                setattr(self, _WAITED, True)
                return result

            setattr(wait_once, _MARK, True)
            cls.wait = wait_once
            installed = True
    return installed


def partitions_gathered_in_full(params: list[Any]) -> list[Any]:
    """Each parameter whole, from its partitions, by one blocking all-gather per parameter (never
    the coalesced path): the reference a coalesced gather must equal, bit for bit."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    whole = []
    for param in params:
        part = param.ds_tensor.detach().reshape(-1)
        pieces = [torch.empty_like(part) for _ in range(world)]
        dist.all_gather(pieces, part)
        whole.append(torch.cat(pieces)[: param.ds_numel].view(param.ds_shape).clone())
    return whole


def compare(gathered: Any, reference: Any) -> dict[str, Any] | None:
    """What differs between a gathered parameter and its reference (None: nothing)."""
    import torch

    if gathered.shape != reference.shape:
        return {"shape": list(gathered.shape), "expected_shape": list(reference.shape)}
    if torch.equal(gathered, reference):
        return None
    differs = gathered != reference
    return {
        "elements": int(differs.sum()),
        "of": int(gathered.numel()),
        "nan": int(torch.isnan(gathered).sum()),
        "max_abs": float((gathered.float() - reference.float()).abs().nan_to_num(float("inf")).max()),
    }
