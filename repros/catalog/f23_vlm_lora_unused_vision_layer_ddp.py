"""F23 - LoRA on a LLaVA by plain attention names under DDP: adapters in the unused last vision layer stop DDP.

A LoRA ``target_modules`` list written for a language model (``["q_proj", "v_proj"]``, or "all linear")
matches by name suffix, so on a LLaVA it also matches the CLIP vision tower's attention
(``vision_tower...encoder.layers.N.self_attn.q_proj``): the "frozen" tower gets trainable adapters
(haotian-liu/LLaVA#1647). LLaVA reads the image features of the tower's second-to-last layer
(``vision_feature_layer=-2``), so the adapters of its LAST layer never reach the loss and never get a
gradient (trl#1936: "Last layer of the Llava-1.5 visual tower is not training"). DDP, whose reducer
waits for a gradient for every parameter that requires one, fails at the second step: ``RuntimeError:
Expected to have finished reduction in the prior iteration before starting a new one ... Parameter
indices which did not receive grad for rank 0: ...`` (LlamaFactory#6376, LLaVA LoRA with
``lora_target: all``). ``find_unused_parameters=True`` hides it at a cost every step, and the tower's
other adapters still train what the user meant to keep frozen. Under DeepSpeed (ZeRO-2 or 3) or FSDP2 nothing
fails: the last layer's adapters silently never train (DeepSpeed reports their gradient as zero, FSDP2 as
none), as trl#1936 reports; the config grid names that form too (``F23.silent-vision-adapters``).

Families: only a vision-language model has a tower for the names to reach (``llava``; the text
families cannot have it). The ``llava`` cell runs it on the current releases.

bug:   the LLaVA test model (a CLIP tower of 2 layers, frozen, before a Llama language model; image tokens
       and pixels in every batch), LoRA r=8 on ``["q_proj", "v_proj"]`` as written, DDP, bf16 autocast, no
       checkpointing, the fixed trainer's loop.
fixed: the same scenario through the fixed trainer's guards (``family-target-modules``: the names resolved
       to the language model's modules only, so nothing in the tower trains and every adapter is used).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from repros.catalog._stacks import CURRENT
from repros.runtime.context import RankContext
from repros.runtime.families import FAMILIES
from repros.runtime.outcomes import Outcome
from repros.runtime.spec import Expectation, ReproSpec, Signature, Variant
from repros.trainer.scenario import Scenario

SCENARIO = Scenario(engine="ddp", bf16=True, gradient_checkpointing=False)

_RUN = (
    "python -m harness run --cells llava --repros F23 (2026-11-26, torch 2.13.0+cpu, transformers 5.23.0, peft "
    "0.21.2, 2 ranks, gloo): bug REPRODUCED (rank 0 and 1: parameter indices 4 5 6 7 did not receive grad, the "
    "adapters of the tower's last layer), fixed PASS (8 adapter tensors, all in the language model)"
)


def vision_family(facts: Mapping[str, Any]) -> bool:
    """A run of a vision-language model (the same words from a text model are another unused parameter)."""
    family = FAMILIES.get(str(facts.get("family") or ""))
    return family is not None and family.vision


SPEC = ReproSpec(
    id="F23",
    title="LoRA on a LLaVA by plain attention names under DDP: the unused last vision layer's adapters stop DDP",
    upstream=(
        "hiyouga/LlamaFactory#6376 (LLaVA LoRA, lora_target all: Expected to have finished reduction)",
        "huggingface/trl#1936 (the last layer of Llava-1.5's vision tower gets no gradient)",
        "haotian-liu/LLaVA#1647 (LoRA applied to the vision tower during LoRA training)",
    ),
    signatures=(
        Signature(
            id="F23.unused-vision-adapters",
            exception="RuntimeError",
            pattern=r"^Expected to have finished reduction in the prior iteration before starting a new one",
            facts_checks=(vision_family,),
            description="DDP: parameters that require grad got none (the adapters of the vision tower's last "
            "layer, which LLaVA never reads), in a run of a vision-language model",
        ),
        Signature(
            id="F23.silent-vision-adapters",
            exception="repros.trainer.silent_failures.VisionAdaptersGotNoGradient",
            pattern=r"^vision adapters got no gradient",
            facts_checks=(vision_family,),
            description="no error (DeepSpeed, FSDP2), but adapters in the vision tower got no gradient at any "
            "step: the layers LLaVA never reads",
        ),
    ),
    expectations=(
        Expectation("bug", Outcome.REPRODUCED, {}, established_by=_RUN, under=(CURRENT,), established_on="cpu"),
        Expectation("fixed", Outcome.PASS, {}, established_by=_RUN),
    ),
    variants=(
        Variant(
            "find-unused-parameters",
            "DDP's find_unused_parameters=True: the reducer skips what got no gradient (a graph walk every step), "
            "and the tower's other adapters still train",
            {"ddp_find_unused_parameters": True},
            claim="the error message's own advice; LlamaFactory#6376",
        ),
    ),
    impossible_in={
        family.name: "a text model: no vision tower for the attention names to reach"
        for family in FAMILIES.values()
        if not family.vision
    },
    depends_on=("torch", "peft", "transformers"),
    depends_on_why=(
        "peft matches the names in transformers' LLaVA, whose unused tower layer torch's DDP reducer waits for; no "
        "DeepSpeed, accelerate or bitsandbytes runs"
    ),
    description=__doc__ or "",
)


def run(ctx: RankContext) -> None:
    from repros.trainer.fixed_trainer import train
    from repros.trainer.variants import scenario_for

    scenario, guards = scenario_for(ctx, SPEC, SCENARIO)
    train(scenario, ctx, guards)
