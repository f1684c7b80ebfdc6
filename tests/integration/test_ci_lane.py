"""Really runs the ci lane: every repro, both modes, in every ci cell of the shipped
matrix, in real uv environments with real torchrun ranks.

Beside them stands a cell pinned to a release that does not exist: it must end
UNRESOLVABLE with the installer's reason while the other cells still run. Cells are
found by their versions, not their names, so the test follows the matrix.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from packaging.version import Version

from harness.cli import options
from harness.config.repros import discover
from harness.planning.items import plan_items
from tests.support.paths import REPO_ROOT, results_json

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, list[dict], Path, str]:
    shipped = yaml.safe_load((REPO_ROOT / "matrix.yaml").read_text())
    cells = {name: cell for name, cell in shipped["cells"].items() if "ci" in cell.get("lanes", [])}
    cells["no-such-peft"] = {"packages": {"peft": "==0.0.999"}, "lanes": ["ci"]}
    # The shipped excludes that concern the ci cells (they show in the report as skipped).
    exclude = []
    for row in shipped.get("exclude") or []:
        named = row.get("cell")
        ours = [c for c in (named if isinstance(named, list) else [named]) if c in cells]
        if ours:
            exclude.append({**row, "cell": ours})
    matrix = {**shipped, "cells": cells, "exclude": exclude}
    work = tmp_path_factory.mktemp("ci-run")
    matrix_path = work / "matrix.yaml"
    matrix_path.write_text(yaml.safe_dump(matrix, sort_keys=False))
    out = work / "out"
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV"}}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "run",
            "--matrix",
            str(matrix_path),
            "--lane",
            "ci",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        timeout=4800,
    )
    return proc.returncode, results_json(out / "results.jsonl"), out, proc.stdout + proc.stderr


def ci_lane_ids(mode: str) -> set[str]:
    """The documented failures the shipped ci lane plans in ``mode``: each ci cell's own (its ``repros:``, else
    every one) less what the matrix excludes there and what planning derives (F24-F32 run in nightly cells of
    their own)."""
    chosen = {"matrix": REPO_ROOT / "matrix.yaml", "lane": "ci", "modes": [mode]}
    plan = plan_items(options.selection(chosen, cwd=REPO_ROOT))
    return {item.repro_id for item in plan.items if item.strategy is None}


def old_deepspeed(record: dict) -> bool:
    """A deepspeed before 0.19.8, where ZeRO-3's coalesced gathers race on gloo (F17)."""
    version = record["versions"].get("deepspeed")
    return version is not None and Version(version) < Version("0.19.8")


def ran(records: list[dict]) -> list[dict]:
    return [r for r in records if r["outcome"] != "UNRESOLVABLE"]


def find(records: list[dict], repro: str, mode: str, **versions: str) -> dict:
    """The one record of ``repro``/``mode`` in the cell whose resolved versions are ``versions``."""
    matches = [
        r
        for r in ran(records)
        if r["repro"] == repro
        and r["mode"] == mode
        and all((r["versions"].get(k.replace("_", "-")) or "") == v for k, v in versions.items())
    ]
    assert len(matches) == 1, [(r["cell"], r["versions"]) for r in matches]
    return matches[0]


def test_every_observation_matches_its_expectation(ci_run) -> None:
    _, records, _, log = ci_run
    mismatched = [
        (r["cell"], r["repro"], r["mode"], r["outcome"], r.get("expected")) for r in ran(records) if not r["matched"]
    ]
    assert mismatched == [], log


def test_the_fixed_trainer_passes_everywhere_and_records_its_guards(ci_run) -> None:
    _, records, _, _ = ci_run
    fixed = [r for r in ran(records) if r["mode"] == "fixed"]
    assert {r["repro"] for r in fixed} == ci_lane_ids("fixed")
    # A failure a CPU cannot show (F19: Triton's compiler; F24: FSDP2's CUDA copy path; F25: Liger's Triton
    # kernels; F28: accelerate's device-only ParallelismConfig; F36 before bitsandbytes 0.50: no CPU 8-bit AdamW)
    # is INFRA on a CPU in both modes, as expected; every other fixed item passes.
    cpu_impossible = {(r["cell"], r["repro"]) for r in fixed if r["outcome"] == "INFRA" and r["expected"] == "INFRA"}
    assert {r["repro"] for r in ran(records) if (r["cell"], r["repro"]) in cpu_impossible} == {
        "F19",
        "F24",
        "F25",
        "F28",
        "F36",
    }
    fixed = [r for r in fixed if (r["cell"], r["repro"]) not in cpu_impossible]
    assert {(r["cell"], r["repro"], r["outcome"]) for r in fixed if r["outcome"] != "PASS"} == set()
    # A repro that trains with another library's trainer (F18: TRL's) passes by running to its end
    # and records no losses of its own; one held against one process (F35-F37: a fresh batch each step) passes by
    # training what one process trains; every other fixed item trained, its loss falling.
    judged_otherwise = {
        repro_id for repro_id, repro in discover().repros.items() if repro.spec.pass_rule in ("clean-exit", "agrees")
    }
    for r in fixed:
        if r["repro"] not in judged_otherwise:
            assert r["losses"][-1] < r["losses"][0]
        assert all(g["id"] and g["reason"] for g in r["guards"])
    assert "zero3-reentrant-checkpointing" in {
        g["id"] for g in find(records, "F1", "fixed", deepspeed="0.19.2")["guards"]
    }
    assert "input-require-grads" in {
        g["id"] for g in find(records, "F5", "fixed", transformers="4.57.6", deepspeed="0.19.8")["guards"]
    }
    assert "merge-before-sync" in {
        g["id"] for g in find(records, "F4", "fixed", transformers="5.23.0", deepspeed="0.19.8")["guards"]
    }
    assert "ddp-static-graph" in {g["id"] for g in find(records, "F6", "fixed", transformers="4.57.6")["guards"]}
    assert "zero3-gathered-save" in {g["id"] for g in find(records, "F7", "fixed", transformers="4.57.6")["guards"]}
    assert "fsdp1-use-orig-params" in {g["id"] for g in find(records, "F8", "fixed", transformers="5.23.0")["guards"]}
    assert "zero2-for-modules-to-save" in {
        g["id"] for g in find(records, "F9", "fixed", transformers="5.23.0", deepspeed="0.19.2")["guards"]
    }
    assert "resize-before-zero3-init" in {
        g["id"] for g in find(records, "F10", "fixed", transformers="4.43.0")["guards"]
    }


def test_each_failure_reproduces_naturally_where_documented(ci_run) -> None:
    _, records, _, log = ci_run
    f1 = find(records, "F1", "bug", deepspeed="0.19.2")
    assert (f1["outcome"], f1["signature"]) == ("REPRODUCED", "F1.recompute-shape-0"), log
    assert f1["error"]["type"] == "torch.utils.checkpoint.CheckpointError"
    assert find(records, "F1", "bug", deepspeed="0.19.8", transformers="5.23.0")["outcome"] == "NOT_REPRODUCED"
    # F2 needs torch < 2.13: no ci cell reproduces it, every ci cell runs it clean.
    assert {r["outcome"] for r in ran(records) if r["repro"] == "F2" and r["mode"] == "bug"} == {"NOT_REPRODUCED"}
    f3 = find(records, "F3", "bug", transformers="4.57.6", deepspeed="0.19.8")
    assert f3["outcome"] == "REPRODUCED" and f3["error"]["type"] == "ValueError", log
    f3_newer_wording = find(records, "F3", "bug", transformers="5.23.0", bitsandbytes="0.47.0")
    assert f3_newer_wording["signature"] == "F3.to-8bit-needs-bnb-0.48", log
    assert find(records, "F3", "bug", transformers="5.23.0", bitsandbytes="0.50.2", deepspeed="0.19.8")["outcome"] == (
        "NOT_REPRODUCED"
    )
    assert {r["outcome"] for r in ran(records) if r["repro"] == "F4" and r["mode"] == "bug"} == {"REPRODUCED"}
    assert (
        find(records, "F5", "bug", transformers="4.57.6", deepspeed="0.19.8")["signature"] == "F5.deepspeed-loss-assert"
    )
    assert find(records, "F5", "bug", transformers="4.57.6", deepspeed="0.18.0")["signature"] == "F5.no-grad-fn"
    assert find(records, "F5", "bug", transformers="5.23.0", deepspeed="0.19.8")["outcome"] == "NOT_REPRODUCED"
    assert find(records, "F6", "bug", transformers="4.57.6")["signature"] == "F6.marked-ready-twice"
    assert find(records, "F6", "bug", transformers="5.23.0")["outcome"] == "NOT_REPRODUCED"
    f7 = find(records, "F7", "bug", transformers="4.57.6", deepspeed="0.19.8", peft="0.21.2")
    assert f7["signature"] == "F7.reloaded-adapter-differs", log
    assert find(records, "F7", "bug", transformers="5.23.0", deepspeed="0.19.8")["outcome"] == "NOT_REPRODUCED"
    assert {r["signature"] for r in ran(records) if r["repro"] == "F8" and r["mode"] == "bug"} == {
        "F8.uniform-requires-grad"
    }
    assert find(records, "F9", "bug", peft="0.15.0")["signature"] == "F9.modules-to-save-shape-0", log
    assert find(records, "F9", "bug", peft="0.21.2", transformers="4.57.6", deepspeed="0.19.8")["outcome"] == (
        "NOT_REPRODUCED"
    )
    # DeepSpeed#7615 stops modules_to_save training on deepspeed < 0.19.3 before anything is saved.
    assert find(records, "F9", "bug", deepspeed="0.19.2")["outcome"] == "DIFFERENT_ERROR"
    # F14 needs torch < 2.12 (a nightly cell); the ci lane runs it where torch shards uint8, clean.
    assert find(records, "F14", "bug", transformers="5.23.0", deepspeed="0.19.8")["outcome"] == "NOT_REPRODUCED"
    # F23 needs a vision-language model: its own cell trains the LLaVA family.
    f23 = [r for r in ran(records) if r["repro"] == "F23"]
    assert {(r["cell"], r["mode"], r["outcome"]) for r in f23} == {
        ("llava", "bug", "REPRODUCED"),
        ("llava", "fixed", "PASS"),
    }
    assert {r["family"] for r in f23} == {"llava"}, log
    # F33 needs a family that fuses the projections a Llama recipe names: its own cell trains Phi-3, where PEFT
    # refuses q_proj/v_proj and the fixed trainer's names (qkv_proj) train.
    f33 = [r for r in ran(records) if r["repro"] == "F33"]
    assert {(r["cell"], r["mode"], r["outcome"], r["family"]) for r in f33} == {
        ("phi3", "bug", "REPRODUCED", "phi3"),
        ("phi3", "fixed", "PASS", "phi3"),
    }, log
    assert {r["signature"] for r in f33 if r["mode"] == "bug"} == {"F33.target-modules-not-found"}
    f19 = find(records, "F19", "bug", transformers="5.23.0", deepspeed="0.19.8")
    assert f19["outcome"] == "INFRA" and "needs CUDA" in f19["reasons"][0], log
    # F30 in its own ci cell: peft 0.18.1 beside torchao 0.18.0 (the only ci cell with torchao).
    f30 = find(records, "F30", "bug", peft="0.18.1")
    assert (f30["outcome"], f30["signature"]) == ("REPRODUCED", "F30.laqt-import"), log
    assert f30["versions"]["torchao"] == "0.18.0"
    assert "peft-torchao-dispatch-checked" in {g["id"] for g in find(records, "F30", "fixed", peft="0.18.1")["guards"]}
    for repro in ("F24", "F25", "F28"):
        (cuda_only,) = [r for r in ran(records) if r["repro"] == repro and r["mode"] == "bug"]
        assert cuda_only["outcome"] == "INFRA" and f"{repro} needs CUDA" in cuda_only["reasons"][0], log
    assert find(records, "F10", "bug", transformers="4.43.0")["signature"] == "F10.vocab-size-0", log
    elsewhere = [r for r in ran(records) if r["repro"] == "F10" and r["versions"]["transformers"] != "4.43.0"]
    assert {r["outcome"] for r in elsewhere if r["mode"] == "bug"} == {"NOT_REPRODUCED"}


def test_the_gather_race_shows_where_it_exists_and_is_guarded_there(ci_run) -> None:
    """F17: the stress repro finds the race on deepspeed < 0.19.8 and nothing on 0.19.8; the fixed
    trainer waits on every gather there, and every other repro's ZeRO-3 run on an old deepspeed too."""
    _, records, _, log = ci_run
    old = [r for r in ran(records) if r["repro"] == "F17" and old_deepspeed(r)]
    assert old, log
    assert {(r["mode"], r["outcome"]) for r in old} == {("bug", "REPRODUCED"), ("fixed", "PASS")}
    assert {r["signature"] for r in old if r["mode"] == "bug"} == {"F17.gathered-before-arrival"}
    assert find(records, "F17", "bug", deepspeed="0.19.8", transformers="5.23.0")["outcome"] == "NOT_REPRODUCED"
    for r in ran(records):
        if r["mode"] == "fixed" and old_deepspeed(r) and r["repro"] in {"F1", "F17"}:
            assert "zero3-wait-every-gather" in {g["id"] for g in r["guards"]}, (r["cell"], r["repro"])


def test_records_carry_metrics_and_a_rerun_command(ci_run) -> None:
    _, records, _, _ = ci_run
    repros = discover().repros
    for r in ran(records):
        assert r["peak_mem_kind"] in ("cpu_peak_rss", "cuda_max_allocated")
        if r.get("kind") == "crosscheck":
            # A strategy held against one process: one rank for a one-process strategy, else the cell's; its
            # rerun is crosscheck's own command.
            assert r["world_size"] == (1 if r["strategy"].startswith("single-") else 2)
            assert f"--strategies {r['strategy']}" in r["repro_cmd"] and f"--cells {r['cell']}" in r["repro_cmd"]
            continue
        # The cells' world size, or the repro's own (F24 is shown at world size 1, as its thread does).
        assert r["world_size"] == (repros[r["repro"]].spec.world_size or 2) and r["device"] in ("cpu", "cuda")
        assert f"--repros {r['repro']}" in r["repro_cmd"] and f"--cells {r['cell']}" in r["repro_cmd"]
        if r["outcome"] in ("PASS", "NOT_REPRODUCED"):
            assert r["peak_mem_bytes"] > 50 * 2**20
            assert r["step_time_s"]["n"] >= 2 and r["step_time_s"]["median"] > 0


def test_an_unresolvable_cell_is_reported_and_the_rest_still_runs(ci_run) -> None:
    code, records, out, _ = ci_run
    missing = [r for r in records if r["cell"] == "no-such-peft"]
    assert {r["mode"] for r in missing} == {"bug", "fixed"}
    assert all(r["outcome"] == "UNRESOLVABLE" for r in missing)
    assert "peft" in missing[0]["reasons"][0]
    assert code == 1  # an unresolvable cell observes nothing, so it cannot match
    run = json.loads((out / "run.json").read_text())
    assert "unavailable" in run["cells"]["no-such-peft"]


def test_rerun_reuses_the_environments(ci_run, tmp_path: Path) -> None:
    _, records, _, _ = ci_run
    shipped = REPO_ROOT / "matrix.yaml"
    cell = find(records, "F1", "bug", deepspeed="0.19.8", transformers="5.23.0")["cell"]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "run",
            "--matrix",
            str(shipped),
            "--cells",
            cell,
            "--repros",
            "F1",
            "--modes",
            "bug",
            "--out",
            str(tmp_path / "again"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (again,) = results_json(tmp_path / "again" / "results.jsonl")
    assert again["env"]["reused"] is True and again["outcome"] == "NOT_REPRODUCED"


def test_the_run_writes_junit_xml_with_a_testcase_per_item(ci_run) -> None:
    from junitparser import JUnitXml

    _, records, out, _ = ci_run
    suite = next(iter(JUnitXml.fromfile(str(out / "junit.xml"))))
    run = json.loads((out / "run.json").read_text())
    assert suite.tests == len(records) + len(run["excluded"])
    # The only failures are the unresolvable cell's items: every repro planned there (those its family, qwen2,
    # can have and whose packages it installs), both modes.
    unresolvable = [r for r in records if r["outcome"] == "UNRESOLVABLE"]
    assert suite.failures == len(unresolvable) >= 2 * 30
