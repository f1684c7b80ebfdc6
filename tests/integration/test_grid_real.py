"""Really runs a slice of the config grid: ZeRO-3 x LoRA x PeftModel x bf16, checkpointing
non-reentrant (F1's documented combination) or off, in the shipped matrix's ci cell with
DeepSpeed 0.19.2 (before PR #8148) and in the cell of current releases.

F1 must be found by name exactly where its repro reproduces it (DeepSpeed 0.19.2, checkpointing
on), run again through the fixed trainer's guards there and train; everything else must train;
the grid's expectations from matrix.yaml must hold; and the records must rerun one combination."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.paths import REPO_ROOT, results_json

pytestmark = pytest.mark.integration

F1_COMBINATION = "deepspeed-zero3+lora+peft-model+non-reentrant+bf16+none"
NO_CHECKPOINTING = "deepspeed-zero3+lora+peft-model+off+bf16+none"


def ci_cell(**versions: str) -> str:
    """The ci cell whose pins differ from the defaults in exactly ``versions`` (none: the defaults)."""
    shipped = yaml.safe_load((REPO_ROOT / "matrix.yaml").read_text())
    defaults = shipped["defaults"]["packages"]
    for name, cell in shipped["cells"].items():
        overrides = {k: v for k, v in (cell.get("packages") or {}).items() if defaults.get(k) != v}
        wanted = {k: f"=={v}" for k, v in versions.items()}
        if "ci" in cell.get("lanes", []) and overrides == wanted:
            return name
    raise AssertionError(f"the shipped matrix has no ci cell pinning exactly {versions}")


@pytest.fixture(scope="module")
def grid_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, list[dict], str, Path]:
    old, current = ci_cell(deepspeed="0.19.2"), ci_cell()
    out = tmp_path_factory.mktemp("grid") / "out"
    command = [
        sys.executable,
        "-m",
        "harness",
        "grid",
        "--matrix",
        str(REPO_ROOT / "matrix.yaml"),
        "--cells",
        f"{old},{current}",
        "--only",
        "engine=deepspeed-zero3",
        "--only",
        "adapter=lora",
        "--only",
        "attach=peft-model",
        "--only",
        "checkpointing=non-reentrant,off",
        "--only",
        "dtype=bf16",
        "--only",
        "after=none",
        "--out",
        str(out),
    ]
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    proc = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=1800)
    return proc.returncode, results_json(out / "results.jsonl"), proc.stdout + proc.stderr, out


def one(records: list[dict], cell: str, combination: str, mode: str = "as-written") -> dict:
    found = [r for r in records if r["cell"] == cell and r["repro"] == combination and r["mode"] == mode]
    assert len(found) == 1, [(r["cell"], r["repro"], r["mode"]) for r in records]
    return found[0]


def test_f1_is_found_by_name_only_where_its_repro_reproduces_it(grid_run) -> None:
    status, records, log, _ = grid_run
    old, current = ci_cell(deepspeed="0.19.2"), ci_cell()
    found = one(records, old, F1_COMBINATION)
    assert found["outcome"] == "REPRODUCED" and found["signature"].startswith("F1."), log
    assert "CheckpointError" in found["error"]["type"]
    assert found["scenario"]["checkpointing"] == "non-reentrant"
    for cell, combination in ((old, NO_CHECKPOINTING), (current, F1_COMBINATION), (current, NO_CHECKPOINTING)):
        trained = one(records, cell, combination)
        assert trained["outcome"] == "PASS", (cell, combination, trained.get("reasons"), trained.get("error"))
    assert status == 0, log  # every expectation the grid declares for these held


def test_a_known_failure_is_run_again_through_the_guards_and_trains(grid_run) -> None:
    _, records, log, _ = grid_run
    guarded = one(records, ci_cell(deepspeed="0.19.2"), F1_COMBINATION, mode="guarded")
    assert guarded["outcome"] == "PASS", (guarded.get("reasons"), guarded.get("error"), log)
    assert guarded["guards"], "the fixed trainer applied no workaround"
    assert not [r for r in records if r["mode"] == "guarded" and r["repro"] != F1_COMBINATION]


def test_the_expectations_in_the_matrix_cover_the_documented_combination(grid_run) -> None:
    _, records, _, _ = grid_run
    for cell in (ci_cell(deepspeed="0.19.2"), ci_cell()):
        record = one(records, cell, F1_COMBINATION)
        assert record["expected"] and record["matched"], record
        assert record["expected_established_by"]


def test_a_record_reruns_its_one_combination(grid_run) -> None:
    _, records, _, _ = grid_run
    record = one(records, ci_cell(), NO_CHECKPOINTING)
    argv = shlex.split(record["repro_cmd"])
    assert "grid" in argv and argv.count("--only") == 6 and "checkpointing=off" in argv
