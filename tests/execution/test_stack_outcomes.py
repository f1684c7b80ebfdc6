"""The cell's stack failing (a package that does not import, one the cell lacks) is INFRA with the
rank's reason, in both modes and for a scenario as users write it: never DIFFERENT_ERROR, FAIL or
NEW_FAILURE. A documented signature that names that very error still wins."""

from __future__ import annotations

from harness.execution.classify import classify
from harness.records.rank import RankRecord
from repros.catalog.f1_zero3_frozen_ckpt import SPEC as F1
from repros.runtime.outcomes import Outcome
from repros.runtime.spec import Expectation, ReproSpec, Signature
from tests.support.rank_records import failed_launch, rank_record

DISTUTILS = "deepspeed does not import in this cell: ModuleNotFoundError: No module named 'distutils'"


def _import_error(rank: int, etype: str, message: str, stack: str | None) -> RankRecord:
    error = {"type": etype, "message": message, "traceback": "", "stack_failure": stack}
    return rank_record(rank, "error", phase="run", error=error)


def test_a_package_that_does_not_import_is_infra_in_both_modes() -> None:
    launch = failed_launch({0: _import_error(0, "ModuleNotFoundError", "No module named 'distutils'", DISTUTILS)})
    for mode in ("bug", "fixed"):
        seen = classify(mode, F1, launch)
        assert seen.outcome == Outcome.INFRA
        assert seen.reasons == (f"rank 0: {DISTUTILS}",)
    assert classify("scenario", F1, launch, []).outcome == Outcome.INFRA


def test_the_same_error_without_the_ranks_word_is_still_the_scenarios() -> None:
    launch = failed_launch({0: _import_error(0, "ModuleNotFoundError", "No module named 'distutils'", None)})
    assert classify("bug", F1, launch).outcome == Outcome.DIFFERENT_ERROR
    assert classify("fixed", F1, launch).outcome == Outcome.FAIL


def test_a_documented_import_error_is_reproduced_not_infra() -> None:
    torchao = ReproSpec(
        id="X30",
        title="torchao removed a class PEFT imports",
        upstream=(),
        signatures=(
            Signature("X30.cannot-import", "ImportError", r"cannot import name 'LinearActivationQuantizedTensor'"),
        ),
        expectations=(Expectation("bug", Outcome.REPRODUCED),),
    )
    message = "cannot import name 'LinearActivationQuantizedTensor' from 'torchao.quantization'"
    launch = failed_launch({0: _import_error(0, "ImportError", message, "peft does not import in this cell: ...")})
    seen = classify("bug", torchao, launch)
    assert seen.outcome == Outcome.REPRODUCED and seen.signature == "X30.cannot-import"
    # In fixed mode no signature is looked for: the stack's reason stands.
    assert classify("fixed", torchao, launch).outcome == Outcome.INFRA
