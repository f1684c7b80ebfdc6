"""What users do with a trained adapter, checked by its consequence: the logits.

``save-reload``: rank 0 saves the adapter as users write it (``save_pretrained`` on the
PEFT model, nothing gathered first) and loads it back into a fresh base model; ``merge``: the
adapter merged into the base on a copy; ``sync``: by name into an inference target (F4's path).
Each compares the result's logits on the training batch with the trained model's, within a
tolerance that the untrained base must exceed (else the check could not tell, and says so); a
mismatch raises a named silent failure (``repros/trainer/silent_failures.py``).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from repros.trainer.scenario import Scenario

#: Logits of a bf16 model agree with a float32 reload to a few hundredths; float32 to far less.
TOLERANCE = {True: 0.05, False: 1e-3}


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def _fresh_base(scenario: Scenario) -> Any:
    if scenario.quantization:
        from repros.trainer.quantized import load_quantized_tiny_qwen2

        # Loaded as the trained base was (the repack guard changes the CPU 4-bit kernels).
        return load_quantized_tiny_qwen2(
            scenario.quantization, no_repack=scenario.bnb_no_repack, quant_storage=scenario.bnb_4bit_quant_storage
        )
    from repros.trainer.tiny_models import tiny_qwen2

    return tiny_qwen2()


def _logits(model: Any, batch: Any, bf16: bool) -> Any:
    import torch

    model.eval()
    from repros.trainer.tiny_models import model_inputs

    with torch.no_grad(), torch.autocast(batch.device.type, dtype=torch.bfloat16, enabled=bf16):
        return model(**model_inputs(batch)).logits.float().cpu()


def _tolerance(scenario: Scenario) -> float:
    """The coarse tolerance where the forward is approximate: bf16, or a quantized base (4-bit
    computes in bf16; LLM.int8 quantizes the activations too), the fine one in float32."""
    return TOLERANCE[bool(scenario.bf16 or scenario.quantization)]


def _check(
    facts: dict[str, Any], got: Any, reference: Any, base: Any, scenario: Scenario, error: type[Exception], what: str
) -> None:
    """Raise ``error`` unless ``got`` (the logits of ``what``) agrees with the trained model's
    within the tolerance; ``base`` (the untrained base's) shows whether the check can tell."""
    tolerance = _tolerance(scenario)
    diff = float((got - reference).abs().max())
    base_diff = float((base - reference).abs().max())
    facts.update(max_abs_diff=diff, base_max_abs_diff=base_diff, tolerance=tolerance)
    facts["check_can_tell"] = base_diff > tolerance
    if diff > tolerance:
        raise error(
            f"{what}'s logits differ from the trained model's by {diff:.4g} "
            f"(tolerance {tolerance}; the untrained base differs by {base_diff:.4g})"
        )


def reference_logits(trained: Any, scenario: Scenario) -> Any:
    """The trained model's logits on its own batch, float32 on CPU: a forward of the wrapped model
    (every rank takes it under ZeRO-3 / FSDP), in the precision it trained in (DeepSpeed's bf16
    casts the weights; DDP and FSDP train under autocast when bf16, in float32 otherwise)."""
    import torch

    from repros.trainer.tiny_models import model_inputs

    wrapped, batch = trained.wrapped, trained.batch
    wrapped.eval()
    autocast = scenario.bf16 and trained.engine != "deepspeed"
    with torch.no_grad(), torch.autocast(batch.device.type, dtype=torch.bfloat16, enabled=autocast):
        return wrapped(**model_inputs(batch)).logits.float().cpu()


def save_reload(trained: Any, scenario: Scenario, ctx: Any, facts: dict[str, Any]) -> None:
    from repros.trainer.silent_failures import ReloadedAdapterDiffers

    reference = reference_logits(trained, scenario)  # every rank: a forward of the wrapped model
    with tempfile.TemporaryDirectory(prefix="ft-regress-adapter-") as directory:
        if ctx.rank == 0:
            trained.model.save_pretrained(directory)  # as users write it: nothing gathered first
            facts["saved_bytes"] = sum(p.stat().st_size for p in Path(directory).rglob("*") if p.is_file())
        _barrier()
        if ctx.rank == 0:
            from peft import PeftModel

            base = _fresh_base(scenario)
            base_logits = _logits(base, trained.batch.cpu(), scenario.bf16)
            loaded = PeftModel.from_pretrained(_fresh_base(scenario), directory)
            got = _logits(loaded, trained.batch.cpu(), scenario.bf16)
            _check(facts, got, reference, base_logits, scenario, ReloadedAdapterDiffers, "the reloaded adapter")
        _barrier()


def merge(trained: Any, scenario: Scenario, ctx: Any, facts: dict[str, Any]) -> None:
    import torch

    from repros.trainer.silent_failures import MergedModelDiffers
    from repros.trainer.tiny_models import tiny_qwen2
    from repros.trainer.weight_sync import gather_full, merge_copy

    reference = reference_logits(trained, scenario)
    gathered = gather_full(trained.model, ctx.rank == 0)  # a collective under ZeRO-3
    if gathered is not None:
        _, full = gathered
        # The copy is the item's family's model (what was trained), not the sync engine's Qwen2 layout.
        merged = merge_copy(trained.model, full, base_factory=tiny_qwen2)
        model = tiny_qwen2().float()
        with torch.no_grad():
            for name, param in model.named_parameters():
                param.copy_(merged[name])
        base_logits = _logits(tiny_qwen2(), trained.batch.cpu(), scenario.bf16)
        got = _logits(model, trained.batch.cpu(), scenario.bf16)
        _check(facts, got, reference, base_logits, scenario, MergedModelDiffers, "the merged model")
    _barrier()


def sync(trained: Any, scenario: Scenario, ctx: Any, facts: dict[str, Any]) -> None:
    from repros.trainer import weight_sync

    target = weight_sync.make_target(ctx.device) if ctx.rank == 0 else None
    if target is not None:
        facts["target"] = target.kind
    try:
        if scenario.merge_before_sync:
            weight_sync.sync_merged(trained, target, facts)
        else:
            weight_sync.sync_unmerged(trained.model, target, facts)
    finally:
        if target is not None:
            target.close()  # a real engine is a process of its own
    _barrier()


STEPS = {"save-reload": save_reload, "merge": merge, "sync": sync}


def after_training(trained: Any, scenario: Scenario, ctx: Any) -> None:
    step = STEPS.get(scenario.after_training)
    if step is None:
        return
    facts: dict[str, Any] = {"step": scenario.after_training}
    ctx.facts["after_training"] = facts
    step(trained, scenario, ctx, facts)
