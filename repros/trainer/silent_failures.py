"""Failures that raise nothing: a repro observes them in the training facts and raises
one of these, so that the silent symptom has a signature like any other.

Standard library only (both sides of the process boundary import it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


class LayerAdaptersGotNoGradient(Exception):
    """Training ran, but the adapters inside the decoder layers never got a gradient."""


def layer_adapters_without_gradient(
    grad_norms: Mapping[str, Sequence[Any]], layer_marker: str = ".layers."
) -> list[str]:
    """Adapter parameters inside decoder layers whose gradient was ``None`` at every step."""
    return sorted(
        name for name, values in grad_norms.items() if layer_marker in name and all(v is None for v in values)
    )


def raise_if_layer_adapters_got_no_gradient(train_facts: Mapping[str, Any]) -> None:
    norms: Mapping[str, Sequence[Any]] = train_facts.get("adapter_grad_norms") or {}
    missing = layer_adapters_without_gradient(norms)
    if missing:
        others = sorted(set(norms) - set(missing))
        raise LayerAdaptersGotNoGradient(
            f"layer adapters got no gradient: {len(missing)} of {len(norms)} adapter parameters inside the decoder "
            f"layers had grad None at every step (e.g. {missing[0]}); trained outside the layers: {others or 'none'}"
        )


class VisionAdaptersGotNoGradient(Exception):
    """Training ran, but adapters a LoRA put on a vision-language model's vision tower never got a gradient
    (neither ``None`` nor zero counts): the tower's layers whose output the model never reads (F23)."""


#: A vision-language model's modules before its language model (a name's path component).
VISION_COMPONENTS = ("vision_tower", "multi_modal_projector")


def in_vision_tower(module_name: str) -> bool:
    return any(part in VISION_COMPONENTS for part in module_name.split("."))


def vision_adapters_without_gradient(grad_norms: Mapping[str, Sequence[Any]]) -> list[str]:
    """Adapter parameters in a vision tower with no positive finite gradient at any step (DeepSpeed reports
    an unused parameter's gradient as zero, FSDP2 and DDP as ``None``)."""
    return sorted(
        name
        for name, values in grad_norms.items()
        if in_vision_tower(name) and not any(isinstance(v, int | float) and v > 0 for v in values)
    )


def raise_if_vision_adapters_got_no_gradient(train_facts: Mapping[str, Any]) -> None:
    norms: Mapping[str, Sequence[Any]] = train_facts.get("adapter_grad_norms") or {}
    missing = vision_adapters_without_gradient(norms)
    if missing:
        raise VisionAdaptersGotNoGradient(
            f"vision adapters got no gradient: {len(missing)} of {len(norms)} adapter parameters are in the vision "
            f"tower and got no gradient at any step (e.g. {missing[0]})"
        )


class ReloadedAdapterDiffers(Exception):
    """The adapter was saved and loaded back into a fresh model without an error, but the model
    it makes does not give the trained model's logits."""


class MergedModelDiffers(Exception):
    """The adapter merged into the base without an error, but the merged model does not give
    the trained model's logits."""


class GatheredParameterDiffers(Exception):
    """A ZeRO-3 gather returned without an error, but a parameter it made whole does not equal its
    partitions gathered one blocking all-gather at a time: it was read before its gather arrived."""


class ReferenceForwardDiffers(Exception):
    """A frozen model's forward of the same batch, run again, gave other logits without an error."""


class DeepSpeedConfigDisagrees(Exception):
    """transformers' ``Trainer`` trained without an error, but the DeepSpeed engine used another batch
    size, gradient accumulation, clipping or learning rate than the ``TrainingArguments`` asked for."""


class LossNotFinite(Exception):
    """Training ran without an error, but its loss was NaN or infinite."""


class LoadedNotFinite(Exception):
    """A model was loaded without an error, but a rank's weights hold NaN or infinite values that are not the
    checkpoint's (uninitialized placeholders), whatever the loss then showed."""


class LoadedNotCheckpoint(Exception):
    """A model was loaded without an error, but parameters it holds are not the checkpoint's (left at their random
    initialization: transformers' ``MISSING`` rows), whatever the loss then showed (F32)."""


class ShardedForwardDiffers(Exception):
    """A model's forward gave other logits after FSDP2 sharded it, without an error (its 4-bit weights' bytes
    changed on the way: F24)."""


class SavedAdapterIncomplete(Exception):
    """A checkpoint of the adapter was written without an error, but a tensor in it is not the trained
    adapter's full tensor (a shard of it, or other values)."""


class TargetModulesMatchNothing(ValueError):
    """A LoRA target name matches no module of the model: the adapter would silently leave that part out
    (PEFT raises only when no name at all matches; DeepSpeed-Chat's LoRA never does). The harness refuses
    to train and report a LoRA on nothing."""


class TrainsUnlikeOneProcess(Exception):
    """A strategy trained, raising nothing, but not what one process trains on the same global batch: a
    loss, a gradient, a weight, a count of optimizer steps, or what was saved and reloaded differs from the
    one-process reference by more than the precision and the reduction order allow (``crosscheck``)."""


class OptimizerStepSkippedSilently(Exception):
    """An engine skipped optimizer steps (their gradient was not finite) and nothing said so: the loss was
    logged, the loop went on, and the weights were not updated at those steps (F34)."""
