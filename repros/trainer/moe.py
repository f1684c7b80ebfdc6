"""Mixture-of-experts models under ZeRO-3: which modules are the MoE blocks, marking them leaf modules
(the ``zero3-moe-leaf-modules`` guard, F21), and which experts each rank's tokens reach.

ZeRO-3 gathers a module's parameters in the module's forward pre-hook, a collective every rank must
join. An MoE block whose experts are modules of their own (transformers 4.x: ``nn.ModuleList`` of
expert MLPs, only the experts some token was routed to called) has each rank gather the experts its
own tokens reached: where ranks route differently their collectives stop pairing and they wait on
each other for ever. A leaf module (``deepspeed.utils.set_z3_leaf_modules``) is gathered whole by
its own pre-hook, every expert on every rank, whatever the routing.
"""

from __future__ import annotations

from typing import Any

#: How the MoE block classes of transformers' models are named (Mixtral, Qwen2-MoE, Qwen3-MoE, ...).
MOE_BLOCK_SUFFIXES = ("SparseMoeBlock",)


def moe_block_classes(model: Any) -> list[type]:
    """The classes of the model's MoE blocks, each once, in the order met."""
    found: list[type] = []
    for module in model.modules():
        cls = type(module)
        if cls.__name__.endswith(MOE_BLOCK_SUFFIXES) and cls not in found:
            found.append(cls)
    return found


def mark_moe_blocks_leaf(model: Any) -> list[str]:
    """Mark every MoE block of ``model`` a ZeRO-3 leaf module; the class names marked."""
    from deepspeed.utils import set_z3_leaf_modules

    classes = moe_block_classes(model)
    if classes:
        set_z3_leaf_modules(model, classes)
    return [cls.__name__ for cls in classes]


def experts_routed(model: Any, batch: Any) -> list[list[int]]:
    """Per MoE layer, the experts the router sends ``batch``'s tokens to (a forward of the whole,
    unpartitioned model without gradients: call it before ZeRO-3 partitions anything)."""
    import torch

    routed: list[list[int]] = []
    hooks = []

    def record(module: Any, inputs: Any, output: Any) -> None:
        logits = output[0] if isinstance(output, tuple) else output
        k = int(getattr(module, "_ft_regress_top_k", 1))
        routed.append(sorted({int(e) for e in torch.topk(logits.float(), k, dim=-1).indices.reshape(-1)}))

    for block in model.modules():
        if type(block).__name__.endswith(MOE_BLOCK_SUFFIXES):
            gate = block.gate
            gate._ft_regress_top_k = int(getattr(block, "top_k", 1))
            hooks.append(gate.register_forward_hook(record))
    try:
        with torch.no_grad():
            model(input_ids=batch)
    finally:
        for hook in hooks:
            hook.remove()
    return routed


class ZeRO3GathersDiverged(RuntimeError):
    """The ranks' ZeRO-3 parameter gathers stopped pairing up: at the same gather, ranks gather the
    parameters of different modules (or one rank never gets there). Their all-gathers would pair
    wrongly: NCCL waits for ever (the watchdog's timeout), gloo aborts on a size mismatch."""


_FETCH_CHECK = "_ft_regress_checks_gathers_in_step"


def check_gathers_in_step(timeout_s: float) -> bool:
    """Before each ZeRO-3 fetch of a module's parameters, compare with every other rank which module
    it is, through the process group's store (not a collective: a rank that went another way cannot
    block it); raise ``ZeRO3GathersDiverged`` where they differ, or where another rank does not reach
    the same fetch within ``timeout_s``. Installed once per process; False where it already was.

    An instrument, not a workaround: it changes nothing the ranks compute, it only turns the hang
    (or gloo's abort) that diverging gathers lead to into an error that names the two modules."""
    import datetime as dt

    import deepspeed
    import torch.distributed as dist
    from deepspeed.runtime.zero import partitioned_param_coordinator as coordinator
    from deepspeed.utils import z3_leaf_module
    from torch.distributed.distributed_c10d import _get_default_store

    cls = coordinator.PartitionedParameterCoordinator
    original = cls.fetch_sub_module
    if getattr(original, _FETCH_CHECK, False):
        return False
    timeout = dt.timedelta(seconds=timeout_s)
    count = [0]

    def fetch_in_step(self: Any, current_submodule: Any, forward: bool, *args: Any, **kwargs: Any) -> Any:
        if any(True for _ in current_submodule.parameters(recurse=z3_leaf_module(current_submodule))):
            _compare_fetch(current_submodule, forward, count, timeout, timeout_s, dist, _get_default_store())
        return original(self, current_submodule, forward, *args, **kwargs)

    setattr(fetch_in_step, _FETCH_CHECK, True)
    cls.fetch_sub_module = fetch_in_step

    # The modules' names, for the message: set on every module as the engine is made.
    initialize = deepspeed.initialize

    def naming_initialize(*args: Any, **kwargs: Any) -> Any:
        model = kwargs.get("model", args[1] if len(args) > 1 else None)
        if model is not None:
            for name, module in model.named_modules():
                module._ft_regress_name = name or "(the model)"
        return initialize(*args, **kwargs)

    deepspeed.initialize = naming_initialize
    return True


def _describe(module: Any, forward: bool) -> str:
    name = getattr(module, "_ft_regress_name", None) or f"module {getattr(module, 'ds_id', '?')}"
    return f"{name} ({type(module).__name__}, {'forward' if forward else 'backward'})"


def _compare_fetch(
    module: Any, forward: bool, count: list[int], timeout: Any, timeout_s: float, dist: Any, store: Any
) -> None:
    count[0] += 1
    n = count[0]
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = _describe(module, forward)
    store.set(f"ft-regress/gathers/{n}/{rank}", mine)
    for other in range(world):
        if other == rank:
            continue
        key = f"ft-regress/gathers/{n}/{other}"
        try:
            store.wait([key], timeout)
        except Exception as exc:  # the store's own timeout error (its type varies with torch)
            raise ZeRO3GathersDiverged(
                f"ZeRO-3 ranks gather different modules' parameters: rank {other} did not reach gather {n} within "
                f"{timeout_s:g} s, where rank {rank} gathers {mine}"
            ) from exc
        theirs = store.get(key).decode()
        if theirs != mine:
            raise ZeRO3GathersDiverged(
                f"ZeRO-3 ranks gather different modules' parameters: at gather {n} rank {rank} gathers {mine}, "
                f"rank {other} gathers {theirs}"
            )
