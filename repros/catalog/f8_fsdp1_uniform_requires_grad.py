"""F8 - FSDP1 with a frozen base and trainable LoRA in one unit: "uniform requires_grad".

torch's first FSDP (``FullyShardedDataParallel``) concatenates each unit's parameters into one
flat parameter, which has a single ``requires_grad``. Wrapping each decoder layer (the usual
``transformer_auto_wrap_policy``) or the whole model puts the layer's frozen base weights and its
trainable LoRA weights into one unit, and FSDP1 refuses at construction:
``ValueError: Must flatten tensors with uniform `requires_grad` when `use_orig_params=False```
(torch >= 2.1; torch 2.0 said ``FlatParameter` requires uniform `requires_grad``` and refused
even with ``use_orig_params=True``). torch PR #98221 let ``use_orig_params=True`` keep a
``requires_grad`` per original parameter; PEFT's ``fsdp_auto_wrap_policy`` gives each LoRA layer a
unit of its own. ``use_orig_params=False`` is still FSDP1's default: by design, not a regression.

bug:   tiny Qwen2, LoRA r=8 on q/v by ``get_peft_model``, ``FullyShardedDataParallel`` with each
       decoder layer a unit (``transformer_auto_wrap_policy``) and FSDP1's default
       ``use_orig_params=False``, ``device_id`` the rank's device (on a CPU FSDP1 needs
       ``device_id=torch.device("cpu")``), bf16 autocast, no checkpointing, a torch AdamW.
fixed: the same scenario through the fixed trainer's guards (``fsdp1-use-orig-params``).

Not F8: "Must flatten tensors with uniform dtype" (a bf16 base with float32 adapters in one unit)
and "FSDP needs a non-CPU accelerator device" (FSDP1 on a CPU without ``device_id``).
"""

from __future__ import annotations

from repros.catalog._stacks import CURRENT, TF4, TORCH_2_0_TF4_40
from repros.catalog._surveyed import SURVEYED, surveyed_by
from repros.runtime.context import RankContext
from repros.runtime.outcomes import Outcome
from repros.runtime.spec import Expectation, ReproSpec, Signature
from repros.trainer.guards import GuardRule

#: torch >= 2.1 (``_flat_param.py`` / ``flat_param.py``: ``_validate_tensors_to_flatten``).
_NEW = r"Must flatten tensors with uniform `requires_grad` when `use_orig_params=False`"
#: torch 2.0 (``flat_param.py``: ``_init_flat_param``), before PR #98221.
_OLD = r"`FlatParameter` requires uniform `requires_grad`"

# Established by running (2026-11-23, 2 ranks, gloo, CPU): torch 2.13.0 with transformers 5.23.0 and
# 4.57.6 (peft 0.21.2) REPRODUCED, fixed PASS; torch 2.0.1 (transformers 4.40.2, peft 0.10.0) INFRA in
# both modes: its FSDP1 asks CUDA for the compute device before it flattens anything ("Found no NVIDIA
# driver on your system"), so torch 2.0's wording is matched from upstream reports only. No version
# boundary to bisect: use_orig_params=False is FSDP1's default in every torch, and the check is by design.
# Not run here: torch 2.1.x, whose FSDP1 on a CPU refuses at its lazy init ("Stream() takes no
# arguments", seen by a plain torchrun run) after the constructor already raised F8.
_ESTABLISHED = (
    "python -m harness run --matrix M --repros F8, M = matrix.yaml's defaults with cells current, "
    "transformers==4.57.6, and torch==2.0.1 + transformers==4.40.2 + peft==0.10.0 + accelerate==0.29.3 without "
    "deepspeed and bitsandbytes (2026-11-23)"
)
_CPU_NOTE = "on CPU: torch 2.0's FSDP1 needs CUDA at construction (on a GPU runner this cell can run)"

SPEC = ReproSpec(
    id="F8",
    title="FSDP1 with a frozen base and trainable LoRA in one unit: uniform requires_grad",
    upstream=(
        "huggingface/peft#1702",
        "pytorch/pytorch#100945",
        "pytorch/pytorch#104690",
        "pytorch/pytorch#91167",
        "huggingface/transformers#27542",
        "mosaicml/llm-foundry#414",
        "pytorch/pytorch PR #98221 (use_orig_params=True allows non-uniform requires_grad)",
    ),
    signatures=(
        Signature(
            id="F8.uniform-requires-grad",
            exception="ValueError",
            pattern=rf"(?:{_NEW}|{_OLD})",
            description="FSDP1 refuses to flatten frozen and trainable parameters into one unit (torch >= 2.1 "
            "wording; torch 2.0: `FlatParameter` requires uniform `requires_grad`)",
        ),
    ),
    expectations=(
        Expectation(
            "bug",
            Outcome.INFRA,
            {"torch": "<2.1"},
            established_by=_ESTABLISHED,
            note=_CPU_NOTE,
            device="cpu",
            under=(TORCH_2_0_TF4_40,),
            observed={"torch": ("2.0.1",)},
        ),
        Expectation(
            "bug",
            Outcome.REPRODUCED,
            {"torch": ">=2.1"},
            established_by=(
                f"{_ESTABLISHED}; at torch 2.4.0: {surveyed_by('openrlhf-v0.4.0')}; "
                f"at torch 2.5.1: {surveyed_by('trl-2514')}"
            ),
            under=(CURRENT, TF4, SURVEYED["openrlhf-v0.4.0"], SURVEYED["trl-2514"]),
            observed={"torch": ("2.4.0", "2.5.1", "2.13.0")},
            established_on="cpu",
        ),
        Expectation(
            "fixed", Outcome.INFRA, {"torch": "<2.1"}, established_by=_ESTABLISHED, note=_CPU_NOTE, device="cpu"
        ),
        Expectation("fixed", Outcome.PASS, {"torch": ">=2.2"}, established_by=_ESTABLISHED),
    ),
    depends_on=("torch",),
    depends_on_why=(
        "the refusal is torch's own check (FSDP1's flat parameter has one requires_grad, and use_orig_params=False is "
        "its default in every release): whichever transformers built the model and whichever peft froze its base and "
        "added trainable adapters, a unit holding both is refused; no DeepSpeed, accelerate or bitsandbytes runs"
    ),
    description=__doc__ or "",
)


def run(ctx: RankContext) -> None:
    from repros.trainer.fixed_trainer import train
    from repros.trainer.scenario import Scenario
    from repros.trainer.variants import scenario_for

    scenario = Scenario(
        engine="fsdp1",
        bf16=True,
        gradient_checkpointing=False,
        fsdp1_wrap="layer",
        fsdp1_use_orig_params=False,
    )
    scenario, guards = scenario_for(ctx, SPEC, scenario)
    train(scenario, ctx, guards)


# The fixed trainer's workaround of this failure: chosen by repros/trainer/guards.py (in its order), listed in
# docs/guards.md.
GUARD = GuardRule(
    "fsdp1-use-orig-params",
    "F8",
    lambda s, v: s.engine == "fsdp1" and not s.fsdp1_use_orig_params and s.fsdp1_wrap != "peft",
    {"fsdp1_use_orig_params": True},
    lambda v: "FSDP1 without use_orig_params refuses frozen and trainable parameters in one unit (F8)",
    explained=(
        "FSDP1 with ``use_orig_params=False`` flattens each unit's parameters into one and refuses frozen base "
        "weights and trainable adapters in one unit (F8); keep the original parameters (``use_orig_params=True``, "
        "torch PR #98221)."
    ),
)
