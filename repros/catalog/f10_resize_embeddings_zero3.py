"""F10 - ``resize_token_embeddings`` under ZeRO-3 (model partitioned as it loaded) with LoRA.

Adding a token (a pad token, most often) calls ``resize_token_embeddings``. When the model was
built inside ``deepspeed.zero.Init`` (an ``HfDeepSpeedConfig`` alive while ``from_pretrained``
runs, as ``TrainingArguments(deepspeed=...)`` arranges), every weight is a ZeRO-3 partition whose
local shape is ``[0]``. transformers 4.43.0 (PR #31979: ``old_embeddings.weight.data =
new_embeddings.weight.data``) resizes such an embedding by replacing its data outside a gather:
the embedding's partitioned shape keeps the old vocabulary while ``num_embeddings`` and the config
say the new one, and with ``pad_to_multiple_of`` the size is read from the partition,
``config.vocab_size`` becomes 0 and the LM head is not resized at all. The first loss then fails
with ``RuntimeError: shape '[-1, 0]' is invalid for input of size N`` (the wording of
transformers#26398, an earlier window with the same cause), or, without ``pad_to_multiple_of``,
a batch holding the new id fails with ``IndexError: index out of range in self`` - and one holding
only old ids trains, silently, a model whose embedding and head disagree. transformers PR #32214
(4.43.4) gathers around the resize.

bug:   tiny Qwen2 saved and loaded with ``from_pretrained`` under ``zero.Init`` (ZeRO-3, every
       parameter partitioned, float32), one token added with
       ``resize_token_embeddings(129, pad_to_multiple_of=64)``, LoRA r=8 on q/v by
       ``get_peft_model``, ``deepspeed.initialize``, full-length (packed) batches, which hold no
       pad; after training, the embedding, LM head and config must agree on the vocabulary
       (``ResizedEmbeddingsInconsistent`` when they do not).
fixed: the same scenario through the fixed trainer's guards (``resize-before-zero3-init``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packaging.version import Version

from repros.catalog._stacks import CURRENT, TF4, TF_4_43
from repros.runtime.context import RankContext
from repros.runtime.outcomes import Outcome
from repros.runtime.spec import Expectation, ReproSpec, Signature
from repros.trainer.guards import GuardRule, Versions
from repros.trainer.scenario import Scenario

#: Tokens the scenario adds, and the multiple it pads the vocabulary to.
ADDED_TOKENS = 1
PAD_TO_MULTIPLE_OF = 64

# Established by running (2026-11-23, torch 2.13.0+cpu, deepspeed 0.19.8, 2 ranks, gloo): transformers
# 4.43.0 (peft 0.11.1, accelerate 0.31.0) REPRODUCED (config.vocab_size 0: "shape '[-1, 0]' is invalid");
# with the new id in the batch IndexError, and without pad_to_multiple_of and no new id the silent form
# (embedding 128 rows, LM head and config 129); 4.42.4, 4.43.4, 4.57.6 and 5.23.0 (peft 0.21.2)
# NOT_REPRODUCED; fixed PASS in all; then the harness's bisect named the window from both sides. Not run:
# the 4.33 window (transformers#26398; no Qwen2 before 4.37).
_ESTABLISHED = (
    "python -m harness run --matrix M --repros F10, M = matrix.yaml's defaults with cells current, "
    "transformers==4.57.6, transformers==4.42.4 / 4.43.0 / 4.43.4 + peft==0.11.1 + accelerate==0.31.0 (2026-11-23); "
    "then python -m harness bisect --repro F10 --mode bug --package transformers --good 4.42.4 --bad 4.43.0 --cell "
    "tf-4.43.0 -> first bad: transformers==4.43.0 (2 steps, 108 s), and --good 4.43.4 --bad 4.43.0 -> first good: "
    "transformers==4.43.4 (4 steps, 169 s: 4.43.0, 4.43.2, 4.43.3 REPRODUCED; 4.43.4 NOT_REPRODUCED)"
)


def resized_under_zero_init(facts: Mapping[str, Any]) -> bool:
    """The failing run added tokens to a model ZeRO-3 partitioned as it loaded."""
    return int(facts.get("added_tokens") or 0) > 0 and facts.get("zero_init") is True


SPEC = ReproSpec(
    id="F10",
    title="resize_token_embeddings under ZeRO-3 (zero.Init) with LoRA: embedding and head out of step",
    upstream=(
        "huggingface/transformers#32196",
        "huggingface/transformers#32170",
        "huggingface/transformers#26398",
        "huggingface/transformers#25977",
        "huggingface/transformers#41959 (open; a custom output layer, not reproduced here)",
        "huggingface/transformers PR #31979 (introduced the 4.43 window)",
        "huggingface/transformers PR #32214 (fix, 4.43.4)",
        "huggingface/transformers PR #26024, PR #26259 (fixes of the 4.33 window)",
    ),
    signatures=(
        Signature(
            id="F10.vocab-size-0",
            exception="RuntimeError",
            pattern=r"shape '\[-1, 0\]' is invalid for input of size \d+",
            description="the loss reshapes logits by config.vocab_size, which the resize set to 0",
        ),
        Signature(
            id="F10.new-token-out-of-range",
            exception="IndexError",
            pattern=r"index out of range in self",
            facts_checks=(resized_under_zero_init,),
            description="the embedding kept its old partitioned shape: the new token's id is out of range",
        ),
        Signature(
            id="F10.silent-inconsistent-vocabulary",
            exception="repros.trainer.resize_check.ResizedEmbeddingsInconsistent",
            # Its name before the worker side was split (logs of earlier harness versions).
            aliases=("repros.common.resize_check.ResizedEmbeddingsInconsistent",),
            pattern=r"^resized embeddings inconsistent after training",
            facts_checks=(resized_under_zero_init,),
            description="no error, but after training the embedding, LM head and config disagree on the vocabulary",
        ),
    ),
    expectations=(
        Expectation(
            "bug",
            Outcome.REPRODUCED,
            {"transformers": ">=4.43.0,<4.43.4"},
            established_by=_ESTABLISHED,
            under=(TF_4_43,),
            observed={"transformers": ("4.43.0", "4.43.2", "4.43.3")},
            established_on="cpu",
        ),
        Expectation(
            "bug",
            Outcome.NOT_REPRODUCED,
            {"transformers": ">=4.43.4"},
            established_by=_ESTABLISHED,
            under=(TF_4_43, CURRENT, TF4),
            observed={"transformers": ("4.43.4", "4.57.6", "5.23.0")},
            established_on="cpu",
        ),
        Expectation(
            "bug",
            Outcome.NOT_REPRODUCED,
            {"transformers": ">=4.37,<4.43.0"},
            established_by=_ESTABLISHED,
            under=(TF_4_43,),
            observed={"transformers": ("4.42.4",)},
            established_on="cpu",
        ),
        Expectation("fixed", Outcome.PASS, {}, established_by=_ESTABLISHED),
    ),
    depends_on=("torch", "deepspeed", "peft", "transformers", "accelerate"),
    depends_on_why=(
        "transformers resizes the embeddings of a model DeepSpeed partitioned as it loaded (zero.Init, arranged "
        "through transformers' integration, which reads accelerate), before peft adds the adapter, on torch; nothing "
        "is quantized"
    ),
    description=__doc__ or "",
)


def run(ctx: RankContext) -> None:
    from repros.trainer.fixed_trainer import train
    from repros.trainer.resize_check import raise_if_inconsistent, vocabulary_sizes
    from repros.trainer.scenario import Scenario
    from repros.trainer.tiny_models import VOCAB_SIZE
    from repros.trainer.variants import scenario_for

    scenario = Scenario(
        engine="deepspeed",
        zero_stage=3,
        zero3_persistence_threshold=0,
        zero_init=True,
        bf16=False,
        gradient_checkpointing=False,
        add_tokens=ADDED_TOKENS,
        pad_to_multiple_of=PAD_TO_MULTIPLE_OF,
    )
    scenario, guards = scenario_for(ctx, SPEC, scenario)
    trained = train(scenario, ctx, guards)
    sizes = vocabulary_sizes(trained.model)
    ctx.facts["vocabulary"] = sizes
    raise_if_inconsistent(sizes, at_least=VOCAB_SIZE + ADDED_TOKENS)


# The fixed trainer's workaround of this failure: chosen by repros/trainer/guards.py (in its order), listed in
# docs/guards.md.
#: transformers releases whose resize_token_embeddings breaks under zero.Init (F10: from PR #31979
#: to PR #32214). Established by running F10 (see repros/catalog/f10_resize_embeddings_zero3.py).
TRANSFORMERS_ZERO3_RESIZE_BROKEN = (Version("4.43.0"), Version("4.43.4"))


def _zero3_resize_affected(s: Scenario, v: Versions) -> bool:
    transformers = v.get("transformers")
    low, high = TRANSFORMERS_ZERO3_RESIZE_BROKEN
    return (
        s.engine == "deepspeed"
        and s.zero_stage == 3
        and s.zero_init
        and s.add_tokens > 0
        and transformers is not None
        and low <= transformers < high
    )


GUARD = GuardRule(
    "resize-before-zero3-init",
    "F10",
    _zero3_resize_affected,
    {"zero_init": False},
    lambda v: (
        f"transformers {v.get('transformers')} resizes embeddings partitioned by zero.Init to a stale "
        "shape (F10, transformers PR #32214)"
    ),
    explained=(
        "transformers 4.43.0 .. 4.43.3 resizes the token embeddings of a model ZeRO-3 partitioned as it loaded "
        "(``zero.Init``) into an embedding whose partitioned shape keeps the old vocabulary (and "
        "``config.vocab_size`` 0 with ``pad_to_multiple_of``) (F10); load the model whole, resize, and let "
        "``deepspeed.initialize`` partition it."
    ),
)
