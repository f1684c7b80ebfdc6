"""F37 - DeepSpeed accumulating by the engine divides the gradient by ``gradient_accumulation_steps`` once for
every output of the engine on the loss's path: a model that returns its logits beside its loss trains on a
gradient ``gradient_accumulation_steps`` times too small.

DeepSpeed 0.18.3 took PR #7665 (a PyTorch-compatible ``backward``): the engine's ``forward`` registers a
backward hook on every tensor of its output that divides the gradient passing through it by
``gradient_accumulation_steps``. A transformers model's output holds the loss and the logits the loss was
computed from, so the gradient of ``engine.backward(outputs.loss)`` is divided once at the loss and once more
at the logits: with ``gradient_accumulation_steps: 2`` every step applies half the mean gradient. The loss is
logged as usual and goes down, slower; nothing is raised. ZeRO-0, 1 and 2 are affected, ZeRO-3 agrees.
DeepSpeed#8224 is the same hooks' doing (a module used twice in a step). PR #8245 (0.19.6) scales the whole loss
once in ``engine.backward`` and marks its graph as scaled, so the hooks leave it alone. transformers' Trainer is
not affected: it divides the loss itself and passes ``scale_wrt_gas=False`` (transformers PR #35808).

bug:   ZeRO-1, float32, two micro-batches per step accumulated by the engine (``gradient_accumulation_steps: 2``,
       ``engine.backward(outputs.loss)`` and ``engine.step()`` after each), held against one process training
       the same adapter on the same global batch (``crosscheck``'s comparison).
fixed: the same through the fixed trainer's guard: the loss divided by hand and
       ``backward(loss, scale_wrt_gas=False)`` (from 0.18.4: 0.18.3's hooks divide whatever it says, FAIL).
"""

from __future__ import annotations

from packaging.version import Version

from repros.catalog._stacks import CURRENT, DS_0_19_2, TF4, TF4_DS_0_18
from repros.runtime.context import RankContext
from repros.runtime.outcomes import Outcome
from repros.runtime.spec import Diverges, Expectation, ReproSpec, Signature, Variant
from repros.trainer.crosscheck.strategy import diverged_strategy, parse
from repros.trainer.guards import GuardRule

#: What runs: ZeRO-1 (no other failure of ZeRO-2's accumulation in the way) in float32, the engine accumulating.
STRATEGY = "zero1-fp32-accum-engine"
_ESTABLISHED = (
    "python -m harness crosscheck --cells current --pin deepspeed==X --strategies zero0-bf16-accum-engine,"
    "zero2-fp32-accum-manual,zero2-fp32-ckpt-nr-accum-engine (2026-11-29, torch 2.13.0+cpu, transformers 5.23.0, "
    "2 ranks, gloo): with 0.18.3 and 0.19.2 the engine-accumulating strategies DIVERGED at step 0, their gradient "
    "norm half the reference's (0.252 against 0.504), the one accumulating by hand agreed; python -m harness bisect "
    "--repro crosscheck --mode zero2-fp32-ckpt-nr-accum-engine --package deepspeed --good 0.19.8 --bad 0.19.2 -> "
    "first good: deepspeed==0.19.6 (0.19.2, 0.19.5 DIVERGES; 0.19.6, 0.19.8 AGREES); python -m harness run "
    "--cells current --repros F37 --pin deepspeed==X: REPRODUCED with 0.18.3, 0.19.2 and 0.19.5, NOT_REPRODUCED "
    "with 0.18.0, 0.18.2, 0.19.6 and 0.19.8; the guard PASS on 0.19.2 and 0.19.5, FAIL on 0.18.3 (its hooks "
    "ignore scale_wrt_gas, read from the 0.18.3 to 0.18.6 sources)"
)
_CROSSCHECKED = (
    _ESTABLISHED + "; crosscheck --cells current --pin deepspeed==0.18.2 / ==0.18.3 --strategies "
    "zero0-fp32-accum-engine,zero1-fp32-accum-engine,zero3-fp32-accum-engine: all agree on 0.18.2; on 0.18.3 ZeRO-0 "
    "and ZeRO-1 DIVERGED, ZeRO-3 agreed"
)


def engine_accumulating(message: str) -> bool:
    """The strategy that diverged is DeepSpeed's ZeRO-0, 1 or 2, the engine accumulating the micro-batches
    (ZeRO-3 scales its own way: it agreed)."""
    strategy = diverged_strategy(message)
    return strategy is not None and strategy.stage in (0, 1, 2) and strategy.accumulation == "engine"


SPEC = ReproSpec(
    id="F37",
    title=(
        "DeepSpeed accumulating by the engine divides the gradient by gradient_accumulation_steps once per output "
        "on the loss's path (the loss and its logits): gradients that many times too small"
    ),
    upstream=(
        "deepspeedai/DeepSpeed PR #7665 (output backward hooks, 0.18.3)",
        "deepspeedai/DeepSpeed#8224 (the same hooks: a module used twice in a step)",
        "deepspeedai/DeepSpeed PR #8245 (the loss scaled once in engine.backward, 0.19.6)",
        "huggingface/transformers PR #35808 (the Trainer scales by hand: scale_wrt_gas=False)",
    ),
    signatures=(
        Signature(
            id="F37.gas-scaled-per-output",
            exception="repros.trainer.silent_failures.TrainsUnlikeOneProcess",
            pattern=r"trains unlike one process: (grad_norm|gradient|weight|loss|saved_adapter|reloaded|merged)",
            checks=(engine_accumulating,),
            description="a DeepSpeed strategy whose engine accumulates the micro-batches trains otherwise than one "
            "process on the same global batch (its gradient divided by the accumulation steps more than once), "
            "nothing raised",
        ),
    ),
    expectations=(
        Expectation(
            "bug",
            Outcome.REPRODUCED,
            {"deepspeed": ">=0.18.3,<0.19.6"},
            established_by=_ESTABLISHED,
            under=(CURRENT, DS_0_19_2),
            observed={"deepspeed": ("0.18.3", "0.19.2", "0.19.5")},
            established_on="cpu",
        ),
        Expectation(
            "bug",
            Outcome.NOT_REPRODUCED,
            {"deepspeed": ">=0.19.6"},
            established_by=_ESTABLISHED,
            under=(CURRENT, TF4),
            observed={"deepspeed": ("0.19.6", "0.19.8")},
            established_on="cpu",
        ),
        Expectation(
            "bug",
            Outcome.NOT_REPRODUCED,
            {"deepspeed": "<0.18.3"},
            established_by=_ESTABLISHED,
            under=(TF4_DS_0_18,),
            observed={"deepspeed": ("0.18.0", "0.18.2")},
            established_on="cpu",
        ),
        Expectation("fixed", Outcome.PASS, {"deepspeed": "!=0.18.3"}, established_by=_ESTABLISHED),
        Expectation(
            "fixed",
            Outcome.FAIL,
            {"deepspeed": "==0.18.3"},
            established_by=_ESTABLISHED,
            note="0.18.3's hooks divide whatever backward's scale_wrt_gas says (0.18.4 honours it), so no loop can "
            "undo them: the guard leaves it, and the gradient stays too small (upgrade to 0.18.4 or later, or "
            "accumulate by hand)",
            observed={"deepspeed": ("0.18.3",)},
            established_on="cpu",
        ),
    ),
    depends_on=("torch", "deepspeed", "peft", "transformers"),
    depends_on_why=(
        "deepspeed's output hooks divide at each tensor of a transformers model's output on torch's backward path "
        "to a peft adapter; nothing of accelerate or bitsandbytes takes part"
    ),
    description=__doc__ or "",
    steps=4,
    pass_rule="agrees",
    # ZeRO-0, 1 and 2 with the engine accumulating, while the hooks scale per output (ZeRO-3 agreed on 0.18.3).
    diverges=(Diverges(("zero[012]-*-accum-engine*",), {"deepspeed": ">=0.18.3,<0.19.6"}, _CROSSCHECKED),),
    variants=(
        Variant(
            "scale-by-hand",
            "the loss divided by hand and backward(loss, scale_wrt_gas=False), as transformers' Trainer does",
            {"deepspeed_scale_by_hand": True},
            claim="huggingface/transformers PR #35808",
        ),
    ),
)


def run(ctx: RankContext) -> None:
    from repros.trainer.crosscheck.check import crosscheck_repro

    crosscheck_repro(ctx, SPEC, parse(STRATEGY))


#: The engine's output hooks (PR #7665, 0.18.3) divide by gradient_accumulation_steps once per output on the
#: loss's path until PR #8245 (0.19.6) marks the loss's graph as scaled (bisected).
DEEPSPEED_OUTPUT_HOOKS_SCALE_TWICE = (Version("0.18.3"), Version("0.19.6"))
#: From 0.18.4 the hooks leave the gradient alone under ``backward(loss, scale_wrt_gas=False)`` (0.18.3 divides
#: whatever it says: no loop can undo it there).
DEEPSPEED_HOOKS_HONOUR_SCALE_WRT_GAS = Version("0.18.4")

# The fixed trainer's workaround of this failure: chosen by repros/trainer/guards.py (in its order), listed in
# docs/guards.md.
GUARD = GuardRule(
    "deepspeed-scale-by-hand",
    "F37",
    lambda s, v: (
        s.engine == "deepspeed"
        and s.trainer_loop == "own"
        and s.gradient_accumulation_steps > 1
        and not s.deepspeed_scale_by_hand
        and (deepspeed := v.get("deepspeed")) is not None
        and DEEPSPEED_HOOKS_HONOUR_SCALE_WRT_GAS <= deepspeed < DEEPSPEED_OUTPUT_HOOKS_SCALE_TWICE[1]
    ),
    {"deepspeed_scale_by_hand": True},
    lambda v: (
        f"deepspeed {v.get('deepspeed')} (>= {DEEPSPEED_OUTPUT_HOOKS_SCALE_TWICE[0]}, < "
        f"{DEEPSPEED_OUTPUT_HOOKS_SCALE_TWICE[1]}) divides the gradient by gradient_accumulation_steps once for "
        "every output of the engine on the loss's path (the loss and the logits it came from), so the model "
        "trains on a gradient that many times too small (F37, DeepSpeed PR #7665, fixed by PR #8245): the loss "
        "divided by hand and backward(loss, scale_wrt_gas=False), as transformers' Trainer does"
    ),
    explained=(
        "DeepSpeed 0.18.3 .. 0.19.5, the engine accumulating: its output hooks divide the gradient by "
        "``gradient_accumulation_steps`` at every output on the loss's path (the loss and its logits), so a "
        "transformers model trains on a gradient that many times too small (F37, PR #7665; fixed by PR #8245 in "
        "0.19.6): the loss divided by hand and ``backward(loss, scale_wrt_gas=False)``, as transformers' Trainer "
        "does (from 0.18.4; 0.18.3's hooks divide whatever it says)."
    ),
)
