"""What the survey of real stacks proved (``ft-regress atlas survey``, the stacks of
``harness/analysis/atlas/survey.yaml``), kept as the catalog keeps every proof: expectations with the command
that established them.

Each surveyed stack is a point: its runs built the stack as it is (its other packages as of its own day), ran a
failure's ``bug`` mode once, on a CPU with 2 ranks, and saw one outcome. The expectation pins every package the
failure depends on to the release the ranks imported, so it answers for that stack and nothing else; stacks that
agree on those packages share it (one run answered both). Not a repro: discovery skips modules named ``_*``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from repros.runtime.outcomes import Outcome
from repros.runtime.spec import Expectation

_SURVEYED_BY = (
    "python -m harness atlas survey --slice {slice}/8 --repros F1,F5,F7,F8 (2026-11-29, {ids}: {stack}; on a CPU, "
    "2 ranks, gloo)"
)

#: The releases each surveyed stack's ranks imported, by the survey's id (the packages documented failures
#: depend on; the stack's others were installed as of its day and decide none of F1, F5, F7, F8).
SURVEYED: dict[str, dict[str, str]] = {
    "openrlhf-v0.4.0": {
        "torch": "==2.4.0",
        "deepspeed": "==0.14.4",
        "transformers": "==4.43.3",
        "peft": "==0.12.0",
        "accelerate": "==0.33.0",
    },
    "trl-v0.12.0": {
        "torch": "==2.5.1",
        "deepspeed": "==0.15.3",
        "transformers": "==4.46.1",
        "peft": "==0.13.2",
        "accelerate": "==1.1.0",
    },
    "llamafactory-v0.9.1": {
        "torch": "==2.5.1",
        "deepspeed": "==0.14.4",
        "transformers": "==4.46.1",
        "peft": "==0.12.0",
        "accelerate": "==1.0.1",
    },
    "ms-swift-v3.0.0": {
        "torch": "==2.5.1",
        "deepspeed": "==0.14.5",
        "transformers": "==4.47.1",
        "peft": "==0.14.0",
        "accelerate": "==1.2.1",
    },
    "trl-2514": {
        "torch": "==2.5.1",
        "deepspeed": "==0.15.3",
        "transformers": "==4.46.3",
        "peft": "==0.14.0",
        "accelerate": "==1.0.1",
    },
    "openrlhf-v0.6.0": {
        "torch": "==2.6.0",
        "deepspeed": "==0.16.3",
        "transformers": "==4.48.3",
        "peft": "==0.14.0",
        "accelerate": "==1.4.0",
    },
    "axolotl-v0.8.0": {
        "torch": "==2.6.0",
        "deepspeed": "==0.15.4",
        "transformers": "==4.50.3",
        "peft": "==0.15.0",
        "accelerate": "==1.5.2",
    },
    "llamafactory-v0.9.3": {
        "torch": "==2.7.1",
        "deepspeed": "==0.16.9",
        "transformers": "==4.52.4",
        "peft": "==0.15.2",
        "accelerate": "==1.7.0",
    },
    "axolotl-v0.12.0": {
        "torch": "==2.8.0",
        "deepspeed": "==0.17.4",
        "transformers": "==4.55.0",
        "peft": "==0.17.0",
        "accelerate": "==1.10.0",
    },
    "openrlhf-v0.9.0": {
        "torch": "==2.9.0",
        "deepspeed": "==0.18.1",
        "transformers": "==4.57.0",
        "peft": "==0.17.1",
        "accelerate": "==1.11.0",
    },
    "newest-2026-07": {
        "torch": "==2.13.0",
        "deepspeed": "==0.19.3",
        "transformers": "==5.14.1",
        "peft": "==0.20.0",
        "accelerate": "==1.14.0",
    },
    "openrlhf-v0.11.0": {
        "torch": "==2.13.0",
        "deepspeed": "==0.19.5",
        "transformers": "==5.15.0",
        "peft": "==0.20.0",
        "accelerate": "==1.14.0",
    },
    "open-instruct-v0.1.0": {
        "torch": "==2.9.0",
        "deepspeed": "==0.18.4",
        "transformers": "==4.57.6",
        "peft": "==0.18.1",
        "accelerate": "==1.12.0",
    },
    "open-instruct-v0.3.0": {
        "torch": "==2.10.0",
        "deepspeed": "==0.18.4",
        "transformers": "==5.4.0",
        "peft": "==0.18.1",
        "accelerate": "==1.12.0",
    },
    "newest-2026-08": {
        "torch": "==2.13.0",
        "deepspeed": "==0.19.6",
        "transformers": "==5.16.1",
        "peft": "==0.20.0",
        "accelerate": "==1.14.0",
    },
}

#: The slice of 8 each stack is in (``atlas survey --slice``), for its command.
SLICE: dict[str, int] = {
    "openrlhf-v0.4.0": 1,
    "trl-v0.12.0": 1,
    "llamafactory-v0.9.1": 2,
    "ms-swift-v3.0.0": 3,
    "trl-2514": 3,
    "openrlhf-v0.6.0": 4,
    "axolotl-v0.8.0": 4,
    "llamafactory-v0.9.3": 5,
    "axolotl-v0.12.0": 5,
    "openrlhf-v0.9.0": 6,
    "open-instruct-v0.1.0": 6,
    "open-instruct-v0.3.0": 7,
    "newest-2026-07": 7,
    "openrlhf-v0.11.0": 8,
    "newest-2026-08": 8,
}

#: The surveyed stacks with transformers 5 (their runs saw neither F5 nor F7, as the catalog's ranges say).
TRANSFORMERS_5 = ("open-instruct-v0.3.0", "newest-2026-07", "openrlhf-v0.11.0", "newest-2026-08")

#: Stacks whose runs answered for another surveyed stack too (the same releases of what decides the failure).
ANSWERS_TOO: dict[str, tuple[str, ...]] = {"trl-v0.12.0": ("axolotl-v0.5.0",)}

#: Why a stack's failures cannot run on a CPU, where its runs found that.
DOES_NOT_IMPORT_ON_CPU = (
    "DeepSpeed before 0.16.4 with triton 3.2 (torch 2.6's) does not import without a GPU: triton's autotuner, built "
    "as deepspeed imports, finds no active driver ('RuntimeError: 0 active drivers', DeepSpeed#7028); on a GPU it "
    "imports"
)


#: The surveyed stacks whose failures cannot run on a CPU, and why.
CANNOT_RUN_ON_CPU: dict[str, str] = {
    "openrlhf-v0.6.0": DOES_NOT_IMPORT_ON_CPU,
    "axolotl-v0.8.0": DOES_NOT_IMPORT_ON_CPU,
}


def surveyed(depends_on: Sequence[str], otherwise: Mapping[str, str] | None = None) -> tuple[Expectation, ...]:
    """One ``bug`` expectation per surveyed stack (stacks pinning the same releases of ``depends_on`` share one),
    as the survey's run of the failure there saw it: REPRODUCED, or the outcome ``otherwise`` names for the stack;
    INFRA on a CPU, with why, for a stack that cannot run there. Each holds where every package the failure
    depends on is at the stack's release."""
    found: dict[tuple[tuple[str, str], ...], Expectation] = {}
    for stack_id, stack in SURVEYED.items():
        when = {p: stack[p] for p in depends_on if p in stack}
        key = tuple(sorted(when.items()))
        if key in found:
            continue
        note = CANNOT_RUN_ON_CPU.get(stack_id, "")
        outcome = Outcome.INFRA if note else (otherwise or {}).get(stack_id, Outcome.REPRODUCED)
        found[key] = Expectation(
            "bug",
            outcome,
            when,
            established_by=surveyed_by(stack_id),
            note=note,
            device="cpu" if note else None,
            under=(stack,),
            observed={p: (spec.removeprefix("=="),) for p, spec in when.items()},
            established_on="cpu",
        )
    return tuple(found.values())


def surveyed_by(stack_id: str) -> str:
    """The command whose run established what the survey saw of a stack."""
    ids = ", ".join((stack_id, *ANSWERS_TOO.get(stack_id, ())))
    stack = " ".join(f"{p}{v}" for p, v in SURVEYED[stack_id].items())
    return _SURVEYED_BY.format(slice=SLICE[stack_id], ids=ids, stack=stack)
