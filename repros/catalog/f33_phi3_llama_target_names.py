"""F33 - LoRA on a Phi-3 by Llama's names: ``q_proj``/``v_proj`` are nowhere, PEFT refuses (or adapts less).

A LoRA recipe written for a Llama names the attention's ``q_proj`` and ``v_proj`` (and ``k_proj``, ``gate_proj``,
``up_proj``...). Phi-3 fuses query, key and value into one ``qkv_proj`` and gate and up into one
``gate_up_proj``, so those names match no module of it. PEFT matches each name against the model's module
names (the whole name or a dotted suffix): where none matches it refuses, ``ValueError: Target modules
{'q_proj', 'v_proj'} not found in the base model. Please check the target modules and try again.`` (a
``NoMatchingPeftModuleError``, a ``ValueError``, in later PEFT), before anything trains (LlamaFactory#4020,
whose users met it with Phi-3's larger models; the same refusal for Baichuan's ``W_pack``, LlamaFactory#43, and
ChatGLM's ``query_key_value``, LlamaFactory#1785). Where some names match (``o_proj``, ``down_proj`` in the
list) PEFT is silent and adapts those alone: the harness refuses that form as
``TargetModulesMatchNothing`` (F33's silent form, as the config grid meets it with DeepSpeed-Chat's LoRA,
which converts only what matches). Phi-3's own names are the fix: ``qkv_proj`` for ``q_proj``/``k_proj``/
``v_proj``, ``gate_up_proj`` for ``gate_proj``/``up_proj`` (``explain`` offers them).

Families: only a family that fuses the projections (``phi3``); the others keep Llama's names (a LLaVA's
language model is a Llama). The ``phi3`` cell runs it on the current releases.

bug:   the Phi-3 test model, LoRA r=8 on ``["q_proj", "v_proj"]`` as written, by ``get_peft_model``, DDP, bf16
       autocast, no checkpointing, the fixed trainer's loop.
fixed: the same scenario through the fixed trainer's guards (``family-target-modules``: the names resolved for
       the family, ``["qkv_proj"]``), which trains.
"""

from __future__ import annotations

import re

from repros.catalog._stacks import CURRENT, TF4, TF4_PEFT_0_15_0
from repros.runtime.context import RankContext
from repros.runtime.families import FAMILIES
from repros.runtime.outcomes import Outcome
from repros.runtime.spec import Expectation, ReproSpec, Signature
from repros.trainer.guards import GuardRule, Versions
from repros.trainer.scenario import Scenario
from repros.trainer.targets import family_target_names, resolution_changes

SCENARIO = Scenario(engine="ddp", bf16=True, gradient_checkpointing=False)

_RUN = (
    "python -m harness run --cells phi3 --repros F33 (2026-11-27, torch 2.13.0+cpu, transformers 5.23.0, peft 0.21.2, "
    "2 ranks, gloo): bug REPRODUCED (peft.utils.error.NoMatchingPeftModuleError: Target modules {'q_proj', 'v_proj'} "
    "not found in the base model), fixed PASS (qkv_proj); python -m harness run --cells tf4,tf4-peft-0.15.0 --family "
    "phi3 --repros F33 (2026-11-27): the same in transformers 4.57.6 with peft 0.21.2, and with peft 0.15.0 a plain "
    "ValueError of the same words; fixed PASS in both"
)

#: The names a Llama recipe writes that some family keeps elsewhere (Phi-3's fused projections).
FUSED_NAMES = {name for family in FAMILIES.values() for name, _ in family.fused_targets}
_QUOTED = re.compile(r"'([^']+)'")


def _names(message: str) -> list[str]:
    """The target names a message lists (``{'q_proj', 'v_proj'}`` or ``['q_proj']``), before what follows."""
    head = re.split(r"not found in|match no module", message, maxsplit=1)[0]
    return _QUOTED.findall(head)


def names_fused_projections(message: str) -> bool:
    """The names the message lists include a projection a Llama recipe names and a family fuses (q_proj, k_proj,
    v_proj, gate_proj, up_proj)"""
    return bool(FUSED_NAMES & set(_names(message)))


def in_a_fusing_family(message: str) -> bool:
    """The model the message names fuses a projection the message lists (Phi-3's qkv_proj, gate_up_proj)"""
    found = re.search(r"match no module of (?:the language model of )?the (\S+) model", message)
    family = FAMILIES.get(found.group(1)) if found else None
    return family is not None and bool({name for name, _ in family.fused_targets} & set(_names(message)))


def own_names(message: str) -> str | None:
    """Each fusing family's own names for the ones the message lists."""
    names = _names(message)
    offers = []
    for family in FAMILIES.values():
        fused = dict(family.fused_targets)
        if not fused or not set(names) & set(fused):
            continue
        resolved = list(family_target_names(family, names))
        mapping = ", ".join(f"{n} -> {fused[n]}" for n in names if n in fused)
        every = list(dict.fromkeys(family.target_name(n) for n in ("q_proj", "o_proj", "gate_proj", "down_proj")))
        offers.append(
            f"in {family.model_class} ({family.name}) write target_modules={resolved} ({mapping}; every "
            f"projection: {every})"
        )
    if not offers:
        return None
    other = "another architecture: print(model) lists its linear layers (PEFT matches a name or its dotted suffix)"
    return "; ".join([*offers, other])


SPEC = ReproSpec(
    id="F33",
    title="LoRA on a Phi-3 by Llama's q_proj/v_proj: the fused qkv_proj has them, PEFT refuses the names",
    upstream=(
        "hiyouga/LlamaFactory#4020 (Phi-3: Target modules ... not found in the base model)",
        "hiyouga/LlamaFactory#43 (Baichuan's W_pack: Target modules ['q_proj', 'v_proj'] not found)",
        "hiyouga/LlamaFactory#1785 (ChatGLM's query_key_value)",
        "vllm-project/vllm#4915 (a Phi-3 adapter trained on Llama's names, loaded by name)",
    ),
    signatures=(
        Signature(
            id="F33.target-modules-not-found",
            exception="ValueError",
            aliases=("peft.utils.error.NoMatchingPeftModuleError",),
            pattern=r"Target modules .* not found in the base model",
            checks=(names_fused_projections,),
            advice=own_names,
            description="PEFT finds none of the target names in the model, and they are Llama's names for "
            "projections a family fuses (Phi-3's qkv_proj, gate_up_proj)",
        ),
        Signature(
            id="F33.silent-partial-targets",
            exception="repros.trainer.silent_failures.TargetModulesMatchNothing",
            pattern=r"match no module of",
            checks=(names_fused_projections, in_a_fusing_family),
            advice=own_names,
            description="no error, but Llama's names for projections the model fuses matched nothing: PEFT adapts "
            "only the names that matched, DeepSpeed-Chat's LoRA converts only those (the harness refuses it)",
        ),
    ),
    expectations=(
        Expectation(
            "bug",
            Outcome.REPRODUCED,
            {},
            established_by=_RUN,
            under=(CURRENT, TF4, TF4_PEFT_0_15_0),
            established_on="cpu",
        ),
        Expectation("fixed", Outcome.PASS, {}, established_by=_RUN),
    ),
    impossible_in={
        family.name: "it keeps Llama's q_proj/k_proj/v_proj and gate_proj/up_proj: the names match"
        for family in FAMILIES.values()
        if not family.fused_targets
    },
    depends_on=("peft", "transformers"),
    depends_on_why=(
        "PEFT matches the names against the modules of the model transformers built (Phi-3 fuses qkv_proj and "
        "gate_up_proj in every transformers that has it), and refuses before any engine, trainer or optimizer "
        "exists: torch, DeepSpeed, accelerate and bitsandbytes take no part"
    ),
    description=__doc__ or "",
)


def run(ctx: RankContext) -> None:
    from repros.trainer.fixed_trainer import train
    from repros.trainer.variants import scenario_for

    scenario, guards = scenario_for(ctx, SPEC, SCENARIO)
    train(scenario, ctx, guards)


# The fixed trainer's workaround of this failure: chosen by repros/trainer/guards.py (in its order), listed in
# docs/guards.md.
def _family_targets_unresolved(s: Scenario, v: Versions) -> bool:
    return not s.family_targets and resolution_changes(s.model_family(), s.target_modules)


GUARD = GuardRule(
    "family-target-modules",
    "F33",
    _family_targets_unresolved,
    {"family_targets": True},
    lambda v: (
        "LoRA target names written for a Llama miss or over-reach in this family (Phi-3's fused qkv_proj and "
        "gate_up_proj; a VLM's CLIP tower has q_proj/v_proj too): resolved per family (F33, F23)"
    ),
    also_works_around=("F23",),
    explained=(
        "LoRA target names written for a Llama mean something else, or nothing, in another family: Phi-3 fuses "
        "query, key and value into ``qkv_proj`` and gate and up into ``gate_up_proj`` (PEFT raises only when no "
        "name matches; with ``o_proj``/``down_proj`` among them it silently adapts those alone), and a LLaVA's "
        "CLIP tower has ``q_proj``/``v_proj`` too, so the plain names put adapters on the frozen vision tower; "
        "resolve the names per family (``repros/trainer/targets.py``; F33's workaround, and for a LLaVA F23's). "
        "In every mode a list that partly matches (PEFT's silence) is an error (``TargetModulesMatchNothing``), "
        "never a LoRA on nothing; a list of which no name matches is PEFT's own refusal, as users meet it."
    ),
)
