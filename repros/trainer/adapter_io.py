"""Around the fixed trainer's loop: a base checkpoint to load from (as users ``from_pretrained``),
ZeRO-3's ``zero.Init`` while it loads, and after training the adapter saved, loaded back into a
fresh base model and compared by its logits with the model that was trained.

A failure that raises nothing at save time shows here by its consequence: the reloaded adapter
gives other logits than the trained one (``ReloadedAdapterDiffers``), or loading it raises the
library's own error (e.g. a size mismatch against tensors saved as ``torch.Size([0])``).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from repros.trainer.model import lora_config, target_modules_for
from repros.trainer.silent_failures import ReloadedAdapterDiffers

#: Largest |logit difference| between the reloaded and the trained adapter that still counts as the
#: same adapter (both are float32 forwards of the same weights; a bf16 save rounds nothing more,
#: since the trained module's weights are what is saved).
SAME_LOGITS_ATOL = 1e-4


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


@contextmanager
def shared_workdir() -> Iterator[Path]:
    """A scratch directory every rank of the item sees (rank 0 makes it and names it to the others);
    rank 0 removes it at the end."""
    import torch.distributed as dist

    path = [tempfile.mkdtemp(prefix="ft-regress-item-") if _rank() == 0 else None]
    if dist.is_initialized():
        dist.broadcast_object_list(path, src=0)
    work = Path(str(path[0]))
    try:
        yield work
    finally:
        if _rank() == 0:
            shutil.rmtree(work, ignore_errors=True)


def save_base_checkpoint(work: Path, scenario: Any = None) -> Path:
    """The tiny base model written as a checkpoint (rank 0), for ``from_pretrained`` on every rank: the scenario's
    mixture of experts where it trains one (``moe_experts``; ``repros/trainer/moe_checkpoint.py``)."""
    from repros.trainer.tiny_models import tiny_qwen2

    base_dir = work / "base"
    if _rank() == 0:
        if scenario is not None and scenario.moe_experts:
            from repros.trainer.moe_checkpoint import save_moe_checkpoint

            save_moe_checkpoint(base_dir, scenario.moe_experts, scenario.moe_checkpoint_per_expert)
        else:
            tiny_qwen2().save_pretrained(str(base_dir))
    _barrier()
    return base_dir


def load_base(base_dir: Path) -> Any:
    """The base checkpoint loaded with the item's family's class (``AutoModelForCausalLM`` does not map a
    VLM's config) and the attention implementation the family trains with; a mixture-of-experts checkpoint
    with its own class."""
    from repros.trainer.moe_checkpoint import is_moe_checkpoint, load_moe
    from repros.trainer.tiny_models import load_pretrained

    if is_moe_checkpoint(base_dir):
        return load_moe(base_dir)
    return load_pretrained(str(base_dir))


@contextmanager
def zero_init(config: dict[str, Any]) -> Iterator[Any]:
    """An ``HfDeepSpeedConfig`` alive for the duration, as ``TrainingArguments(deepspeed=...)`` keeps
    one: under ZeRO-3, ``from_pretrained`` then builds the model inside ``deepspeed.zero.Init``."""
    try:
        from transformers.integrations.deepspeed import HfDeepSpeedConfig
    except ImportError:  # transformers < 4.31
        from transformers.deepspeed import HfDeepSpeedConfig

    alive = HfDeepSpeedConfig(config)
    try:
        yield alive
    finally:
        forget_zero_init()


def forget_zero_init() -> None:
    """No ``HfDeepSpeedConfig`` alive any more: a later ``from_pretrained`` builds a plain model."""
    try:
        from transformers.integrations.deepspeed import unset_hf_deepspeed_config
    except ImportError:
        return
    unset_hf_deepspeed_config()


def _zero3_partitioned(model: Any) -> bool:
    return any(hasattr(p, "ds_id") for p in model.parameters())


@contextmanager
def _gathered(params: list[Any], partitioned: bool) -> Iterator[None]:
    if not partitioned:
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
        yield


def save_adapter(trained: Any, scenario: Any, out: Path) -> None:
    """Save the trained adapter to ``out`` as the scenario says (see ``Scenario.save_method``)."""
    model = trained.model
    partitioned = _zero3_partitioned(model)
    if scenario.save_method == "gathered":
        trainable = [p for p in model.parameters() if p.requires_grad]
        with _gathered(trainable, partitioned):
            if _rank() == 0:
                model.save_pretrained(str(out))
    elif scenario.trainer_loop == "hf":
        trained.hf_trainer.save_model(str(out))
    elif _rank() == 0:
        model.save_pretrained(str(out))
    _barrier()


def trained_state(model: Any) -> dict[str, Any] | None:
    """The trainable parameters as the trained model holds them (gathered under ZeRO-3; every rank
    must call it), as float32 copies on rank 0; ``None`` on the other ranks."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    state = None
    with _gathered([p for _, p in named], _zero3_partitioned(model)):
        if _rank() == 0:
            state = {n: p.detach().float().cpu().clone() for n, p in named}
    return state


def saved_files(out: Path) -> dict[str, Any]:
    """What the save left: each file's size, and the adapter tensors' shapes."""
    files = {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.is_file()} if out.is_dir() else {}
    shapes: dict[str, list[int]] = {}
    weights = out / "adapter_model.safetensors"
    unreadable = None
    if weights.exists():
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(weights), framework="pt") as f:
                for key in f.keys():
                    shapes[key] = list(f.get_slice(key).get_shape())
        except SafetensorError as exc:  # an empty file (a save that wrote nothing): what it holds is no tensor
            unreadable = str(exc)
    return {"files": files, "tensor_shapes": shapes, **({"unreadable": unreadable} if unreadable else {})}


def reload_and_compare(scenario: Any, base_dir: Path, adapter_dir: Path, trained: dict[str, Any]) -> dict[str, Any]:
    """On rank 0: the saved adapter loaded into a fresh base model (the library's own
    ``PeftModel.from_pretrained``) against the trained weights put into another fresh one, on a fixed
    batch. Raises ``ReloadedAdapterDiffers`` when the logits differ; what loading raises propagates."""
    import torch
    from peft import PeftModel, get_peft_model

    from repros.trainer.tiny_models import fixed_batch, model_inputs

    saved = saved_files(adapter_dir)
    if saved.get("unreadable") and trained:
        # The adapter was saved without its tensors (an empty file): loading it raises before any comparison.
        raise ReloadedAdapterDiffers(
            f"reloaded adapter differs from the trained one: the saved adapter holds no tensor (saved files "
            f"{saved['files']}: {saved['unreadable']}), the trained one {len(trained)}"
        )
    batch = fixed_batch(0, scenario.batch_size, scenario.seq_len)
    inputs = model_inputs(batch)
    with torch.no_grad():
        base_logits = load_base(base_dir).eval()(**inputs).logits.float()
        fresh = load_base(base_dir)
        reference = get_peft_model(fresh, lora_config(scenario, target_modules_for(fresh, scenario))).eval()
        result = reference.load_state_dict(trained, strict=False)
        if result.unexpected_keys:
            raise RuntimeError(f"the trained state does not fit a fresh PEFT model: {result.unexpected_keys[:3]}")
        trained_logits = reference(**inputs).logits.float()
        reloaded = PeftModel.from_pretrained(load_base(base_dir), str(adapter_dir)).eval()
        reloaded_logits = reloaded(**inputs).logits.float()
    to_trained = float((reloaded_logits - trained_logits).abs().max())
    to_base = float((reloaded_logits - base_logits).abs().max())
    trained_vs_base = float((trained_logits - base_logits).abs().max())
    facts = {
        "max_abs_logit_diff_to_trained": to_trained,
        "max_abs_logit_diff_to_base": to_base,
        "trained_vs_base": trained_vs_base,
    }
    if not to_trained <= SAME_LOGITS_ATOL:
        saved = saved_files(adapter_dir)
        raise ReloadedAdapterDiffers(
            f"reloaded adapter differs from the trained one: max |logit difference| {to_trained:.3g} to the trained "
            f"model, {to_base:.3g} to the untrained base (trained vs base: {trained_vs_base:.3g}); saved files "
            f"{saved['files']}, {len(saved['tensor_shapes'])} adapter tensors"
        )
    return facts


def save_and_check(trained: Any, scenario: Any, ctx: Any, work: Path, base_dir: Path) -> None:
    """Save the adapter, then (every rank) gather what was trained and (rank 0) reload and compare."""
    out = work / "adapter"
    facts: dict[str, Any] = {"method": scenario.save_method, "loop": scenario.trainer_loop}
    ctx.facts["adapter_save"] = facts
    save_adapter(trained, scenario, out)
    if ctx.rank == 0:
        facts.update(saved_files(out))
    state = trained_state(trained.model)
    # A user loads the adapter later, in a process without DeepSpeed: no zero.Init from here on.
    forget_zero_init()
    if ctx.rank == 0:
        assert state is not None
        facts["reload"] = reload_and_compare(scenario, base_dir, out, state)
    _barrier()
