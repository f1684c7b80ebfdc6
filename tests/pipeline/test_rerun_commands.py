"""A rerun command runs the stack its item ran on: every option that chose the stack (``--pin``,
``--as-of``, ``--model``, ``--world-size``, ``--family``) is on it. A run of a floating cell with all
of them is made, one item's printed ``repro_cmd`` is run as printed, and the environment it asks
for, and the item it runs, are the first run's. (Before options were values, the command dropped
``--as-of``: a floating cell's rerun resolved as of today, another stack.)"""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from harness.cli.main import main
from harness.core.invocation import program
from harness.environments import PROVIDERS, Environment
from harness.environments.base import CellRequest
from harness.execution.launchers import LAUNCHERS
from tests.support.throwaway_run import ThrowawayLauncher, ThrowawayProvider


class RecordingProvider(ThrowawayProvider):
    """Installs nothing, but is asked for what a cell's environment would install: each request's
    stack (its package specs, the day it floats as of, the lock) is kept, in order."""

    name: ClassVar[str] = "recording"
    installs_packages: ClassVar[bool] = True
    asked: ClassVar[list[dict[str, Any]]] = []

    def get(self, cell: CellRequest) -> Environment:
        stack = {"packages": dict(cell.packages), "as_of": cell.as_of, "lock": cell.lock, "python": cell.python}
        RecordingProvider.asked.append(stack)
        versions = {name: spec.lstrip("=<>~!") for name, spec in cell.packages.items()}
        return dataclasses.replace(
            super().get(cell), key=json.dumps(stack, sort_keys=True), packages=versions, provider=self.name
        )


@pytest.fixture
def recording(monkeypatch: pytest.MonkeyPatch) -> None:
    RecordingProvider.asked.clear()
    monkeypatch.setitem(PROVIDERS, RecordingProvider.name, RecordingProvider)
    monkeypatch.setitem(LAUNCHERS, "throwaway", ThrowawayLauncher)


def test_a_printed_rerun_command_runs_the_stack_its_item_ran_on(
    recording: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    matrix = tmp_path / "matrix.yaml"
    packages = {"torch": "==2.13.0", "peft": ">=0.15,<0.17", "deepspeed": "==0.19.8", "transformers": "==5.23.0"}
    floating = {"provider": "recording", "lanes": ["ci"], "packages": packages}
    matrix.write_text(yaml.safe_dump({"version": 1, "lanes": {"ci": "the test's"}, "cells": {"floating": floating}}))
    monkeypatch.chdir(tmp_path)  # a rerun command names no --out: its run goes under ./reports
    chosen = ["--pin", "deepspeed==0.19.5", "--as-of", "2025-03-25", "--model", "small", "--world-size", "1"]
    first = tmp_path / "first"
    status = main(
        ["run", "--matrix", str(matrix), "--repros", "F1", "--modes", "bug", "--family", "qwen2,llama"]
        + chosen
        + ["--launcher", "throwaway", "--out", str(first), "--cache-dir", str(tmp_path / "cache")]
    )
    assert status in (0, 1)
    records = [json.loads(line) for line in (first / "results.jsonl").read_text().splitlines()]
    (llama,) = [r for r in records if r["family"] == "llama"]
    ran_on = [a for a in RecordingProvider.asked if a["packages"]["deepspeed"] == "==0.19.5"]
    assert ran_on and all(a["as_of"] == "2025-03-25" for a in ran_on)

    command = shlex.split(llama["repro_cmd"])
    assert command[: len(program())] == program()
    for flag in ("--as-of 2025-03-25", "--pin deepspeed==0.19.5", "--model small", "--world-size 1", "--family llama"):
        assert flag in llama["repro_cmd"], flag
    RecordingProvider.asked.clear()
    assert main([*command[len(program()) :], "--launcher", "throwaway"]) in (0, 1)

    # The same stack asked of the provider, and the same item on it.
    assert RecordingProvider.asked and all(a == ran_on[0] for a in RecordingProvider.asked)
    (again_dir,) = (tmp_path / "reports").iterdir()
    (again,) = [json.loads(line) for line in (again_dir / "results.jsonl").read_text().splitlines()]
    for field in ("cell", "repro", "mode", "family", "model", "world_size", "versions", "repro_cmd"):
        assert again[field] == llama[field], field
    stored = json.loads((again_dir / "run.json").read_text())
    assert stored["as_of"] == "2025-03-25" and stored["options"]["pins"] == [["deepspeed", "==0.19.5"]]


class ResolvingProvider(RecordingProvider):
    """As RecordingProvider, and resolves a floating cell as uv's provider does: the environment
    says when its floating specs were resolved."""

    name: ClassVar[str] = "resolving"
    RESOLVED_AT: ClassVar[str] = "2026-11-26T21:04:05+00:00"

    def get(self, cell: CellRequest) -> Environment:
        env = super().get(cell)
        if any(not spec.startswith("==") for spec in cell.packages.values()):
            env = dataclasses.replace(env, resolution={"as_of": cell.as_of, "resolved_at": self.RESOLVED_AT})
        return env


def test_a_floating_run_without_as_of_reruns_what_it_resolved_not_what_is_newest(
    recording: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(PROVIDERS, ResolvingProvider.name, ResolvingProvider)
    matrix = tmp_path / "matrix.yaml"
    cells = {
        "floating": {"provider": "resolving", "lanes": ["ci"], "packages": {"torch": "==2.13.0", "peft": ">=0.15"}},
        "pinned": {"provider": "resolving", "lanes": ["ci"], "packages": {"torch": "==2.13.0", "peft": "==0.21.2"}},
    }
    matrix.write_text(yaml.safe_dump({"version": 1, "lanes": {"ci": "the test's"}, "cells": cells}))
    monkeypatch.chdir(tmp_path)
    first = tmp_path / "first"
    common = ["--repros", "F8", "--modes", "bug", "--launcher", "throwaway", "--cache-dir", str(tmp_path / "cache")]
    assert main(["run", "--matrix", str(matrix), *common, "--out", str(first)]) in (0, 1)
    by_cell = {r["cell"]: r for r in map(json.loads, (first / "results.jsonl").read_text().splitlines())}
    # The floating cell's rerun resolves as of the second its specs were resolved; the pinned one needs no day.
    assert "--as-of 2026-11-26T21:04:05Z" in by_cell["floating"]["repro_cmd"]
    assert "--as-of" not in by_cell["pinned"]["repro_cmd"]
    RecordingProvider.asked.clear()
    command = shlex.split(by_cell["floating"]["repro_cmd"])
    assert main([*command[len(program()) :], "--launcher", "throwaway"]) in (0, 1)
    assert [a["as_of"] for a in RecordingProvider.asked] == ["2026-11-26T21:04:05Z"]
