"""F31 - TRL's chunked SFT loss under FSDP2 with a PEFT model: ``aten.mm.default got mixed torch.Tensor and DTensor``.

TRL 1.4.0 added ``loss_type="chunked_nll"`` to its SFT (PR #5575; with PEFT, PR #5676; the default from PR
#5846): ``SFTTrainer`` patches the causal LM's ``forward`` so that the loss is computed from the last hidden
states against ``lm_head.weight`` in chunks, the full logits never materialized. Under FSDP2 through accelerate
(``fsdp2_prepare_model``) with a PEFT model, the language-model head is a sharded unit of its own whose forward
the patched forward never calls, so its weight is still the sharded ``DTensor`` when the chunked matmul reads
it, beside hidden states that are plain tensors (TRL's analysis: LoRA's dtype cast strips any DTensor wrapper
from the activations): ``RuntimeError: aten.mm.default got mixed torch.Tensor and DTensor, need to convert all
torch.Tensor to DTensor before calling distributed operators!`` in the first forward (TRL#6064, its distributed
smoke test; #4550 with GRPO). TRL PR #6065 (1.7.0) gathers the weight (``full_tensor()``) first.

bug:   tiny Qwen2, LoRA r=8 on q/v by ``get_peft_model``, the causal LM's forward patched by TRL's own
       ``_patch_chunked_ce_lm_head`` as ``SFTTrainer`` does for ``chunked_nll``
       (``repros/trainer/trl_chunked_loss.py``),
       sharded by accelerate's ``fsdp2_prepare_model`` (the decoder layers, then the root), bf16, the fixed
       trainer's own loop.
fixed: the same through the fixed trainer's guards (``trl-nll-under-fsdp2-peft`` on trl 1.4.0 .. 1.6.x: the plain
       ``nll`` loss, the logits materialized whole).
"""

from __future__ import annotations

from packaging.version import Version

from repros.catalog._stacks import TRL_1_6_0_FSDP2, TRL_1_7_0_FSDP2
from repros.runtime.context import RankContext
from repros.runtime.outcomes import Outcome
from repros.runtime.record import ScenarioUnavailable
from repros.runtime.spec import Expectation, ReproSpec, Signature, Variant
from repros.trainer.guards import GuardRule
from repros.trainer.scenario import Scenario

SCENARIO = Scenario(
    engine="fsdp2",
    fsdp2_accelerate_prepare=True,
    bf16=True,
    gradient_checkpointing=False,
    trl_chunked_nll=True,
)

#: Why a cell without trl cannot show it.
NO_TRL = "trl is not installed in this cell (F31 patches the model with TRL's own chunked SFT loss)"

_ESTABLISHED = (
    "python -m harness run --cells trl-1.6.0-fsdp2,trl-1.7.0-fsdp2 --repros F31 (2026-11-27); python -m harness "
    "bisect --repro F31 --mode bug --package trl --good 1.7.0 --bad 1.6.0 --cell trl-1.6.0-fsdp2 -> first good: "
    "trl==1.7.0 (2 steps, 50 s); by hand (torchrun, 2 ranks, gloo, transformers 5.5.4): trl 1.4.0 fails alike, "
    "1.8.0, 1.9.0 and 1.10.0 train"
)

SPEC = ReproSpec(
    id="F31",
    title="TRL's chunked SFT loss under FSDP2 with a PEFT model: lm_head.weight read as a sharded DTensor",
    upstream=(
        "huggingface/trl#6064",
        "huggingface/trl#4550",
        "huggingface/trl PR #6065 (fix: lm_head gathered with full_tensor(); 1.7.0)",
        "huggingface/trl PR #5575, #5676 (1.4.0: the chunked loss, with PEFT)",
    ),
    signatures=(
        Signature(
            id="F31.mixed-tensor-dtensor",
            exception="RuntimeError",
            pattern=r"aten\.mm\.default:? got mixed torch\.Tensor and DTensor",
            description="the chunked loss multiplies plain hidden states by lm_head.weight still a sharded DTensor "
            "(raised by DTensor's dispatch before any collective: the same wording on NCCL and gloo)",
        ),
    ),
    expectations=(
        Expectation(
            "bug",
            Outcome.REPRODUCED,
            {"trl": ">=1.4.0,<1.7.0"},
            established_by=_ESTABLISHED,
            under=(TRL_1_6_0_FSDP2,),
            observed={"trl": ("1.6.0",)},
            established_on="cpu",
        ),
        # From 1.7.0, not 1.4.0: the range must not overlap the one above (the atlas reads each as a claim).
        Expectation(
            "bug",
            Outcome.NOT_REPRODUCED,
            {"trl": ">=1.7.0"},
            established_by=_ESTABLISHED,
            under=(TRL_1_7_0_FSDP2,),
            observed={"trl": ("1.7.0",)},
            established_on="cpu",
        ),
        Expectation("fixed", Outcome.PASS, {"trl": ">=1.4.0"}, established_by=_ESTABLISHED),
        Expectation("bug", Outcome.INFRA, {}, established_by=_ESTABLISHED, note=NO_TRL, established_on="cpu"),
        Expectation("fixed", Outcome.INFRA, {}, established_by=_ESTABLISHED, note=NO_TRL),
    ),
    variants=(
        Variant(
            "nll",
            "the plain loss (loss_type='nll'): the logits materialized whole (the guard alone, on any trl)",
            {"trl_chunked_nll": False},
            claim="huggingface/trl#6064 (chunked_nll became the default in 1.7.0; 'nll' was it before)",
        ),
    ),
    depends_on=("torch", "peft", "transformers", "accelerate", "trl"),
    depends_on_why=(
        "TRL's chunked loss, patched into a transformers causal LM with peft's adapters, reads lm_head as torch's "
        "FSDP2 (through accelerate's preparation) left it; no DeepSpeed runs, nothing is quantized"
    ),
    description=__doc__ or "",
)


def run(ctx: RankContext) -> None:
    from importlib import metadata

    from repros.trainer.fixed_trainer import train
    from repros.trainer.variants import scenario_for

    try:
        ctx.facts["trl"] = metadata.version("trl")
    except metadata.PackageNotFoundError as exc:
        raise ScenarioUnavailable(NO_TRL) from exc
    scenario, guards = scenario_for(ctx, SPEC, SCENARIO)
    train(scenario, ctx, guards)


# The fixed trainer's workaround of this failure: chosen by repros/trainer/guards.py (in its order), listed in
# docs/guards.md.
#: TRL releases whose SFT ``chunked_nll`` loss multiplies the hidden states by ``lm_head.weight`` still a sharded
#: DTensor under FSDP2 with a PEFT model: from 1.4.0 (PR #5575/#5676) to 1.7.0 (PR #6065). Bisected by F31
#: (repros/catalog/f31_fsdp2_peft_chunked_nll_dtensor.py).
TRL_CHUNKED_NLL_FSDP2_PEFT_BROKEN = (Version("1.4.0"), Version("1.7.0"))

GUARD = GuardRule(
    "trl-nll-under-fsdp2-peft",
    "F31",
    lambda s, v: (
        s.trl_chunked_nll
        and s.engine == "fsdp2"
        and s.lora_impl == "peft"
        and (trl := v.get("trl")) is not None
        and TRL_CHUNKED_NLL_FSDP2_PEFT_BROKEN[0] <= trl < TRL_CHUNKED_NLL_FSDP2_PEFT_BROKEN[1]
    ),
    {"trl_chunked_nll": False},
    lambda v: (
        f"trl {v.get('trl')} (< {TRL_CHUNKED_NLL_FSDP2_PEFT_BROKEN[1]}): SFT's chunked_nll under FSDP2 with a PEFT "
        "model multiplies plain hidden states by lm_head.weight still a sharded DTensor ('aten.mm.default got "
        "mixed torch.Tensor and DTensor', F31, TRL#6064, PR #6065): loss_type='nll' (the logits materialized "
        "whole: more activation memory)"
    ),
    explained=(
        'TRL 1.4.0 .. 1.6.x\'s SFT ``loss_type="chunked_nll"`` computes the loss from the hidden states and '
        "``lm_head.weight`` in its own patched forward; under FSDP2 with a PEFT model ``lm_head`` is a sharded "
        "unit of its own that forward never enters, so its weight is still a ``DTensor`` beside plain hidden "
        "states (``aten.mm.default got mixed torch.Tensor and DTensor``; F31, TRL#6064/#4550, PR #6065): the "
        "plain ``nll`` loss (the logits materialized whole: more activation memory)."
    ),
)
