"""F30 - plain 16-bit LoRA beside torchao 0.18: ``cannot import name 'LinearActivationQuantizedTensor'``.

PEFT's LoRA picks the layer class for each target by running its dispatchers in order (bitsandbytes
8-bit and 4-bit, EETQ, AQLM, AWQ, GPTQ, HQQ, INC, torchao, Megatron, the default), the first one that
returns a module winning. A plain ``nn.Linear`` matches none of the quantized ones and reaches the torchao
dispatcher, which in PEFT before 0.19.0 runs ``from torchao.quantization import
LinearActivationQuantizedTensor`` (for one ``isinstance`` check) whenever torchao is installed. torchao
0.18.0 removed that class, so ``get_peft_model`` raises ``ImportError: cannot import name
'LinearActivationQuantizedTensor' from 'torchao.quantization'`` for the first plain linear layer: 16-bit
LoRA cannot be created at all, while QLoRA trains (bitsandbytes' dispatcher matches its ``Linear4bit``
layers first). Nothing about the model involves torchao; having it installed (a torchao quantizer used
elsewhere, a dependency of another package) is enough. PEFT PR #3140 (0.19.0) checks
``torchao.utils.TorchAOBaseTensor`` instead; unsloth PR #11168 and peft#3223 met the same dispatcher.

The error is raised inside a library function, not by a module that does not import, so it is the
scenario's failure, not the stack's: the signature names it (and a cell without torchao cannot show it:
INFRA with that reason).

bug:   tiny Qwen2, LoRA r=8 on q/v by ``get_peft_model``, float32, DDP, no checkpointing, in a cell with
       torchao installed (the error comes at ``get_peft_model``, before any step).
fixed: the same scenario through the fixed trainer's guards (``peft-torchao-dispatch-checked`` on
       peft < 0.19.0 with torchao >= 0.18.0: PEFT's torchao dispatcher consulted only for torchao weights,
       as PEFT 0.19.0 does; free).
"""

from __future__ import annotations

from packaging.version import Version

from repros.catalog._stacks import TORCHAO_0_18, TORCHAO_PEFT_0_18_1, stack
from repros.runtime.context import RankContext
from repros.runtime.outcomes import Outcome
from repros.runtime.record import ScenarioUnavailable
from repros.runtime.spec import Expectation, ReproSpec, Signature, Variant
from repros.trainer.guards import GuardRule, Versions
from repros.trainer.scenario import Scenario

SCENARIO = Scenario(engine="ddp", bf16=False, gradient_checkpointing=False)

#: Why a cell without torchao cannot show it (the item's reason and the expectation's note).
NO_TORCHAO = "torchao is not installed in this cell: F30 needs it installed beside peft (its dispatcher imports it)"

# Established by running (2026-11-27, torch 2.13.0+cpu, transformers 5.23.0, 2 ranks, gloo); see matrix.yaml's
# torchao cells, and the bisects below.
_ESTABLISHED = (
    "python -m harness run --cells torchao-peft-0.18.1,torchao-0.18 --repros F30 (2026-11-27); "
    "python -m harness bisect --repro F30 --mode bug --package peft --good 0.19.0 --bad 0.18.1 "
    "--cell torchao-peft-0.18.1 -> first good: peft==0.19.0 (2 steps, 318 s); "
    "python -m harness bisect --repro F30 --mode bug --package torchao --good 0.17.0 --bad 0.18.0 "
    "--cell torchao-peft-0.18.1 -> first bad: torchao==0.18.0 (2 steps, 277 s)"
)

SPEC = ReproSpec(
    id="F30",
    title="plain LoRA beside torchao 0.18: PEFT's torchao dispatcher imports a removed class (LoRA cannot be created)",
    upstream=(
        "huggingface/peft PR #3140 (fix: the dispatcher checks TorchAOBaseTensor; 0.19.0)",
        "unslothai/unsloth PR #11168",
        "huggingface/peft#3223",
        "huggingface/peft PR #2062 (0.14.0: the torchao dispatcher and its import)",
        "huggingface/peft PR #3571 (named by the field research; not found in the stored threads)",
    ),
    signatures=(
        Signature(
            id="F30.laqt-import",
            exception="ImportError",
            pattern=r"cannot import name 'LinearActivationQuantizedTensor' from 'torchao\.quantization'",
            description="PEFT's LoRA torchao dispatcher, reached by a plain linear layer, imports a class torchao "
            "0.18.0 removed (the same wording on every backend: it is raised before any collective)",
        ),
    ),
    expectations=(
        Expectation(
            "bug",
            Outcome.REPRODUCED,
            {"peft": ">=0.14.0,<0.19.0", "torchao": ">=0.18.0"},
            established_by=_ESTABLISHED,
            note="PEFT 0.14.0 (PR #2062) added the dispatcher and its import",
            under=(TORCHAO_PEFT_0_18_1,),
            observed={"peft": ("0.18.1",), "torchao": ("0.18.0",)},
            established_on="cpu",
        ),
        # torchao-0.18, and the peft bisect's good step (torchao-peft-0.18.1 with peft 0.19.0). Not the torchao
        # bisect's good step (peft 0.18.1 with torchao 0.17.0): this range names torchao, so it would hold
        # peft 0.18.1 beside every torchao, the failing one too.
        Expectation(
            "bug",
            Outcome.NOT_REPRODUCED,
            {"torchao": ">=0"},
            established_by=_ESTABLISHED,
            under=(TORCHAO_0_18, stack(peft="0.19.0", torchao="0.18.0")),
            observed={"torchao": ("0.18.0",)},
            established_on="cpu",
        ),
        Expectation("fixed", Outcome.PASS, {"torchao": ">=0"}, established_by=_ESTABLISHED),
        Expectation("bug", Outcome.INFRA, {}, established_by=_ESTABLISHED, note=NO_TORCHAO, established_on="cpu"),
        Expectation("fixed", Outcome.INFRA, {}, established_by=_ESTABLISHED, note=NO_TORCHAO),
    ),
    variants=(
        Variant(
            "qlora",
            "4-bit QLoRA instead of 16-bit LoRA: bitsandbytes' dispatcher matches first, torchao's is never reached",
            {"quantization": "nf4"},
            claim="unsloth PR #11168 (QLoRA trains where 16-bit LoRA fails)",
        ),
    ),
    depends_on=("torch", "peft", "torchao"),
    depends_on_why=(
        "peft's LoRA torchao dispatcher imports a class from torchao, whose import runs on the torch it was built "
        "for; the error comes at get_peft_model, for any linear layer of any transformers model, before any engine: "
        "transformers, DeepSpeed, accelerate and bitsandbytes take no part"
    ),
    description=__doc__ or "",
)


def run(ctx: RankContext) -> None:
    from importlib import metadata

    from repros.trainer.fixed_trainer import train
    from repros.trainer.variants import scenario_for

    try:
        ctx.facts["torchao"] = metadata.version("torchao")
    except metadata.PackageNotFoundError as exc:
        raise ScenarioUnavailable(NO_TORCHAO) from exc
    scenario, guards = scenario_for(ctx, SPEC, SCENARIO)
    train(scenario, ctx, guards)


# The fixed trainer's workaround of this failure: chosen by repros/trainer/guards.py (in its order), listed in
# docs/guards.md.
#: PEFT PR #3140 (0.19.0): LoRA's torchao dispatcher checks ``torchao.utils.TorchAOBaseTensor`` instead of
#: importing ``LinearActivationQuantizedTensor``. Bisected by F30 (repros/catalog/f30_peft_torchao_import.py).
PEFT_TORCHAO_BASE_TENSOR_DISPATCH = Version("0.19.0")

#: torchao 0.18.0 removed ``LinearActivationQuantizedTensor``. Bisected by F30.
TORCHAO_WITHOUT_LAQT = Version("0.18.0")


def _peft_torchao_dispatch_imports_removed_class(s: Scenario, v: Versions) -> bool:
    peft, torchao = v.get("peft"), v.get("torchao")
    return (
        s.lora_impl == "peft"
        and not s.peft_torchao_dispatch_checked
        and peft is not None
        and peft < PEFT_TORCHAO_BASE_TENSOR_DISPATCH
        and torchao is not None
        and torchao >= TORCHAO_WITHOUT_LAQT
    )


GUARD = GuardRule(
    "peft-torchao-dispatch-checked",
    "F30",
    _peft_torchao_dispatch_imports_removed_class,
    {"peft_torchao_dispatch_checked": True},
    lambda v: (
        f"peft {v.get('peft')} < {PEFT_TORCHAO_BASE_TENSOR_DISPATCH} imports LinearActivationQuantizedTensor in "
        f"its torchao dispatcher for every plain linear layer, and torchao {v.get('torchao')} no longer has it "
        "(F30, PEFT PR #3140): consult that dispatcher only for torchao weights, as PEFT 0.19.0 does"
    ),
    explained=(
        "PEFT before 0.19.0 imports ``LinearActivationQuantizedTensor`` in LoRA's torchao dispatcher, which every "
        "plain linear layer reaches while torchao is installed; torchao 0.18.0 removed the class, so 16-bit LoRA "
        "cannot be created (``ImportError``; QLoRA's layers match bitsandbytes' dispatcher first) (F30, PEFT PR "
        "#3140): consult that dispatcher only for a weight that is a torchao tensor. It costs nothing measurable."
    ),
)
