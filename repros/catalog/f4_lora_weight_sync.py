"""F4 - LoRA weights synced into an inference engine by name (OpenRLHF + vLLM).

OpenRLHF's ``broadcast_to_vllm`` sends ``(name, tensor)`` for every parameter of the training
model; with a PEFT model the names are ``base_model.model.<hf name>`` and the adapters are
separate tensors, so the engine's name-based ``load_weights`` rejects the first one
(``params_dict[name]``: ``KeyError: 'base_model.model.model.embed_tokens.weight'``; later vLLM:
"There is no module or parameter named 'base_model' in Qwen2ForCausalLM"). Renaming without
merging loads, but drops the adapters: the engine then serves the untrained base.

bug:   tiny Qwen2, LoRA r=8 on q/v, bf16, DeepSpeed ZeRO-3 (as OpenRLHF) with every parameter
       partitioned, trained, then the unmerged sync: each parameter gathered
       (``GatheredParameters``, every rank), rank 0 sends it to the target. No gradient
       checkpointing: F1 is another repro, and would stop training before the sync on an
       affected DeepSpeed.
fixed: the same scenario with the fixed trainer's guards (``merge-before-sync``): gather, merge
       on a copy (``merge_and_unload``), strict load, logit check; in the same run the check is
       shown to refuse a prefix-stripped unmerged sync.

The target is the real vLLM engine wherever vLLM is installed (matrix cell ``vllm-cpu``: an
engine process of its own started by rank 0, weights through its worker), else a fresh
transformers model loaded with the strictness of vLLM <= 0.6 (repros/trainer/weight_sync.py).
Each rank 0 record says which (``weight_sync.target``), and rank 0's log ends with a line
naming it. The model is the tiny Qwen2 with 2 heads and 1 KV head (head_dim 32, which vLLM's
CPU attention needs), in every cell.
"""

from __future__ import annotations

import re

from repros.catalog._stacks import CURRENT, DS_0_19_2, TF4, TF4_DS_0_18
from repros.runtime.context import RankContext
from repros.runtime.outcomes import Outcome
from repros.runtime.spec import Expectation, ReproSpec, Signature
from repros.trainer.guards import GuardRule

#: A name only a PEFT model has: the ``base_model.model.`` prefix, or a LoRA layer's own parts.
_PEFT_PART = r"(?:lora_A|lora_B|lora_embedding_A|lora_embedding_B|base_layer|lora_magnitude_vector)"
PEFT_NAME = rf"(?:base_model\.model\.[\w.]+|[\w.]*\.{_PEFT_PART}(?:\.[\w.]+)?)"

# Deterministic: the loader rejects the first PEFT name whatever the versions; no version boundary.
_ESTABLISHED = (
    "python -m harness run --matrix M --repros F4, M = matrix.yaml's defaults with cells current, "
    "deepspeed==0.19.2 and transformers==4.57.6 (2026-11-23, torch 2.13.0+cpu, peft 0.21.2, 2 ranks, gloo): "
    "bug REPRODUCED (F4.keyerror-peft-name) and fixed PASS in all three; "
    "python -m harness run --cells vllm-cpu --repros F4 (2026-11-23, the real engine: vllm-cpu 0.32.0, "
    "transformers 5.19.0): bug REPRODUCED (F4.no-module-peft-prefix, raised by vLLM's loader) and fixed PASS "
    "(vLLM's prompt logprobs within 0.05 of the trained model's)"
)

_MISSING = re.compile(r"Missing key\(s\) in state_dict: (?P<keys>[^\n]*?)\.\s*(?:\n|$)")
_UNEXPECTED = re.compile(r"Unexpected key\(s\) in state_dict: (?P<keys>[^\n]*?)\.\s*(?:\n|$)")
_KEY = re.compile(r'"([^"]+)"')


def state_dict_keys(message: str, kind: str) -> list[str]:
    """The keys a strict ``load_state_dict`` error lists as ``missing`` or ``unexpected``."""
    pattern = _MISSING if kind == "missing" else _UNEXPECTED
    found = pattern.search(message)
    return _KEY.findall(found.group("keys")) if found else []


def strict_load_rejects_peft_keys(message: str) -> bool:
    """F4's strict-load form: the target misses keys while the state dict brings PEFT-named
    ones (``base_model.model.*``) it does not know."""
    missing = state_dict_keys(message, "missing")
    unexpected = state_dict_keys(message, "unexpected")
    return bool(missing) and any(k.startswith("base_model.model.") for k in unexpected)


SPEC = ReproSpec(
    id="F4",
    title="LoRA weights synced into an inference engine by name: PEFT names rejected",
    upstream=(
        "OpenRLHF/OpenRLHF#546",
        "OpenRLHF/OpenRLHF#991",
        "OpenRLHF/OpenRLHF PR #335 (not merged)",
        "huggingface/trl#2698 (TRL merges before syncing)",
    ),
    signatures=(
        Signature(
            id="F4.keyerror-peft-name",
            exception="KeyError",
            pattern=rf"^'{PEFT_NAME}'$",
            description="the engine's params_dict[name] lookup (vLLM's Qwen2 loader, OpenRLHF's update_weight) "
            "has no parameter by a PEFT name such as 'base_model.model.model.embed_tokens.weight'",
        ),
        Signature(
            id="F4.no-module-peft-prefix",
            exception="ValueError",
            # As raised in the worker (vllm-cpu 0.32.0, engine in-process: what F4's engine
            # process answers); through a multiprocess engine's collective_rpc the caller gets a
            # plain Exception, "Call to collective_rpc method failed: Worker failed with error
            # '<the same text>'" (seen here once, outside the harness).
            aliases=("Exception",),
            pattern=rf"There is no module or parameter named '(?:base_model|[\w.]*{_PEFT_PART}[\w.]*)' in \w+",
            description="vLLM's AutoWeightsLoader walking the model by the first part of a PEFT name",
        ),
        Signature(
            id="F4.strict-load-peft-keys",
            exception="RuntimeError",
            pattern=r"Error\(s\) in loading state_dict for \w+:",
            checks=(strict_load_rejects_peft_keys,),
            description="a strict load_state_dict of the PEFT state dict: missing keys of the plain model and "
            "unexpected base_model.model.* keys",
        ),
    ),
    expectations=(
        Expectation(
            "bug",
            Outcome.REPRODUCED,
            {},
            established_by=_ESTABLISHED,
            under=(CURRENT, DS_0_19_2, TF4, TF4_DS_0_18),
            established_on="cpu",
        ),
        Expectation("fixed", Outcome.PASS, {}, established_by=_ESTABLISHED),
    ),
    depends_on=("torch", "deepspeed", "peft", "transformers"),
    depends_on_why=(
        "peft's parameter names reach a name-based loader of the model's architecture (transformers') after ZeRO-3 "
        "(deepspeed, on torch) gathered them; accelerate and bitsandbytes take no part"
    ),
    description=__doc__ or "",
)


def run(ctx: RankContext) -> None:
    import torch.distributed as dist

    from repros.trainer import fixed_trainer, weight_sync
    from repros.trainer.guards import apply_guards
    from repros.trainer.scenario import Scenario
    from repros.trainer.variants import scenario_for

    # Persistence threshold 0: ZeRO-3 partitions every parameter, as it does the large ones of a
    # real model (its default, 1e5 elements, would keep all of this tiny model's whole, and the
    # gathers would move nothing).
    scenario = Scenario(
        engine="deepspeed",
        zero_stage=3,
        zero3_persistence_threshold=0,
        bf16=True,
        gradient_checkpointing=False,
        sync_weights=True,
    )
    scenario, guards = scenario_for(ctx, SPEC, scenario)
    # F4 trains the engine's model (2 heads, 1 KV head) in every cell, so the stand-in and the
    # real engine see one model.
    with weight_sync.training_the_engine_model():
        trained = fixed_trainer.train(scenario, ctx, guards)
    weight_sync.check_engine_model(trained.model)

    facts: dict[str, object] = {}
    ctx.facts["weight_sync"] = facts
    # Rank 0 alone talks to the engine, as in OpenRLHF; the others take part in the gathers.
    target = weight_sync.make_target(ctx.device) if ctx.rank == 0 else None
    if target is not None:
        facts.update(target.facts())
    try:
        facts["zero3_partitioned_params"] = weight_sync.partitioned_count(trained.model)
        if apply_guards(scenario, guards).merge_before_sync:
            weight_sync.sync_merged(trained, target, facts)
        else:
            weight_sync.sync_unmerged(trained.model, target, facts)
    finally:
        if target is not None:
            target.close()
            facts.update(target.facts())
            print(weight_sync.summary(facts), flush=True)
    if dist.is_initialized():
        dist.barrier()


# The fixed trainer's workaround of this failure: chosen by repros/trainer/guards.py (in its order), listed in
# docs/guards.md.
GUARD = GuardRule(
    "merge-before-sync",
    "F4",
    lambda s, v: s.sync_weights and not s.merge_before_sync,
    {"merge_before_sync": True},
    lambda v: "inference loaders reject PEFT parameter names; merge, load strictly, check (F4)",
    explained=(
        "an inference engine's name-based loader rejects PEFT's parameter names (F4); merge the adapters into the "
        "base (dequantizing first when quantized), load strictly, and check the logits against the trained model."
    ),
)
