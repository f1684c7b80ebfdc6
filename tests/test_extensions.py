"""Each extension kind is one file plus one registration: a throwaway launcher, environment
provider, measure and report writer are registered from this module, and a real ``run`` and
``report`` go through them with nothing else changed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from harness.cli.extensions import EXTENSION_POINTS
from harness.cli.main import main
from harness.environments import PROVIDERS, Environment
from harness.environments.base import CellRequest, ProviderContext
from harness.execution.launchers import LAUNCHERS, LauncherContext, LaunchRequest
from harness.execution.launchers.result import LaunchResult, collect_item
from harness.reports import finalize
from harness.reports.finished import FinishedRun
from repros.runtime import measures
from repros.runtime.measures.base import Measure, Meter, Quantity, Reduction
from repros.runtime.record import write_rank_record
from tests.support import fake_stack, tiny_package
from tests.support.paths import REPO_ROOT


class ThrowawayProvider:
    """This interpreter, as it is (no torch needed: the throwaway launcher runs nothing)."""

    name: ClassVar[str] = "throwaway"
    installs_packages: ClassVar[bool] = False

    def __init__(self, context: ProviderContext) -> None:
        self.cache_dir = context.cache_dir

    def get(self, cell: CellRequest) -> Environment:
        return Environment(
            key="throwaway",
            python=sys.executable,
            python_version="3.11",
            packages={},
            path=None,
            extensions_dir=str(self.cache_dir / "ext"),
            reused=True,
            build_s=0.0,
            provider=self.name,
        )

    def damage(self, env: Environment) -> list[str]:
        return []

    def invalidate(self, env: Environment, reason: str) -> None:
        pass

    def release(self, env: Environment) -> None:
        pass

    def cached(self, cell: CellRequest) -> bool:
        return False

    def cancel(self) -> None:
        pass

    def readiness(self, env: Environment) -> str:
        return "made ready by the throwaway provider"

    @classmethod
    def rank_import_path(cls, env: Environment) -> list[str]:
        return []


class ThrowawayLauncher:
    """Writes what two ranks of a clean run would have recorded, with a throwaway measure."""

    name = "throwaway"
    launched: ClassVar[list[str]] = []

    def __init__(self, context: LauncherContext) -> None:
        self.context = context

    def launch(self, request: LaunchRequest) -> LaunchResult:
        ThrowawayLauncher.launched.append(request.module)
        request.item_dir.mkdir(parents=True, exist_ok=True)
        for rank in range(request.world_size):
            write_rank_record(
                request.item_dir,
                rank,
                {
                    "rank": rank,
                    "status": "ok",
                    "phase": "run",
                    "device": "cpu",
                    "backend": "none",
                    "measures": {"throwaway": {"kind": "made-up", "value": 1000 + rank}},
                },
            )
        return collect_item(
            ["throwaway"],
            request.item_dir,
            request.world_size,
            0,
            False,
            0.1,
            [],
            rank_exitcodes={},
            launcher=self.name,
        )

    def cell_done(self, env: Environment) -> None:
        pass

    def describe(self) -> dict[str, Any]:
        return {}

    def abort(self) -> None:
        pass

    def close(self) -> None:
        pass


class ThrowawayMeter(Meter):
    measure = Measure(
        name="throwaway",
        field="throwaway_bytes",
        kind_field="throwaway_kind",
        reduction=Reduction.MAX_OVER_RANKS,
        description="a throwaway figure per rank",
        quantity=Quantity.MEMORY,
        label="throwaway",
        headline=0,
    )


def write_throwaway(run: FinishedRun) -> Path:
    path = run.dir.path / "throwaway.txt"
    path.write_text(f"{len(run.records)} records\n")
    return path


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(PROVIDERS, ThrowawayProvider.name, ThrowawayProvider)
    monkeypatch.setitem(LAUNCHERS, ThrowawayLauncher.name, ThrowawayLauncher)
    monkeypatch.setitem(measures.METERS, ThrowawayMeter.measure.name, ThrowawayMeter)
    monkeypatch.setitem(finalize.WRITERS, "throwaway", write_throwaway)


def test_a_throwaway_launcher_provider_measure_and_writer_are_used_once_registered(
    registered: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(
        yaml.safe_dump(
            {
                "version": 1,
                "lanes": {"ci": "the test's"},
                "cells": {"mine": {"provider": "throwaway", "lanes": ["ci"]}},
            }
        )
    )
    out = tmp_path / "run"
    status = main(
        [
            "run",
            "--matrix",
            str(matrix),
            "--repros",
            "F1",
            "--modes",
            "bug",
            "--launcher",
            "throwaway",
            "--out",
            str(out),
            "--cache-dir",
            str(tmp_path / "cache"),
        ]
    )
    printed = capsys.readouterr().out
    assert status == 1  # a clean run of F1 where nothing says what to expect is not a match
    assert ThrowawayLauncher.launched == ["repros.catalog.f1_zero3_frozen_ckpt"]
    assert "made ready by the throwaway provider" in printed
    (line,) = (out / "results.jsonl").read_text().splitlines()
    record = json.loads(line)
    assert record["outcome"] == "NOT_REPRODUCED" and record["launcher"] == "throwaway"
    assert record["env"]["provider"] == "throwaway"
    # The measure's own fields, merged over the ranks by its declared reduction.
    assert record["throwaway_bytes"] == 1001 and record["throwaway_kind"] == "made-up"
    assert record["throwaway_bytes_per_rank"] == {"0": 1000, "1": 1001}
    # Every display reads the declaration: the terminal shows it as the headline memory, with its label.
    assert "1001 B (throwaway)" in printed
    assert "throwaway memory" in (out / "index.html").read_text()
    assert (out / "throwaway.txt").read_text() == "1 records\n"
    (out / "throwaway.txt").unlink()
    assert main(["report", str(out)]) == 1 and (out / "throwaway.txt").exists()


def test_every_extension_point_names_a_registry_with_something_in_it() -> None:
    for point in EXTENSION_POINTS:
        # Every kind has built-in entries, but for the repros of installed packages (the built-in
        # catalog is found by discovery).
        assert list(point.registered()) or point.group == "ft_regress.repros", point.kind
        module, _, name = point.where.partition(":")
        assert (REPO_ROOT / module).is_file() and name in (REPO_ROOT / module).read_text(), point.where
        assert point.describe(), point.kind


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """The fake stack (a stand-in torchrun, no torch) and the tiny package, pip-installed into a
    folder on ``PYTHONPATH``: what ``pip install ft-regress-tiny`` does for a team."""
    root = tmp_path_factory.mktemp("installed")
    env = fake_stack.run_env(fake_stack.install(root))
    site = tiny_package.pip_install(tiny_package.tiny(root), root / "site")
    env["PYTHONPATH"] = os.pathsep.join([str(site), env["PYTHONPATH"], str(REPO_ROOT)])
    env["FT_REGRESS_CACHE"] = str(root / "cache")
    fake_stack.write_matrix(root / "matrix.yaml", ["a"])
    return root, env


def harness_run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args], capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=300
    )


def test_an_installed_package_adds_a_repro_and_an_executor_without_editing_the_harness(
    installed: tuple[Path, dict[str, str]],
) -> None:
    root, env = installed
    helped = harness_run(env, "run", "--help")
    assert "tiny" in helped.stdout.split("--executor", 1)[1].split("--", 1)[0]  # among the choices
    out = root / "out"
    done = harness_run(env, "run", "--matrix", str(root / "matrix.yaml"), "--repros", "T100", "--executor", "tiny",
                       "--tiny-label", "night-7", "--out", str(out))  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (record,) = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert record["repro"] == "T100" and record["outcome"] == "REPRODUCED" and record["matched"]
    assert record["signature"] == "T100.sig" and "the shipped symptom, on rank 0" in record["error"]["message"]
    meta = json.loads((out / "run.json").read_text())
    assert meta["concurrency"]["executor"] == "tiny" and meta["concurrency"]["attempts_by_tiny"] == 1
    assert meta["options"]["executor"] == "tiny"
    # Its own option reached it, and run.json keeps it for a resume.
    assert meta["concurrency"]["label"] == "night-7"
    assert meta["options"]["executor_options"] == {"tiny_label": "night-7"}
    # Listed where every registry is: the installed package's names beside the built-ins.
    listed = subprocess.run(
        [sys.executable, "-c", "from harness.cli.extensions import EXTENSION_POINTS as E; "
         "print({p.kind: p.registered() for p in E})"],
        capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=120, check=True,
    ).stdout  # fmt: skip
    assert "'repro source': ['tiny']" in listed and "'executor': ['local', 'ray', 'slurm', 'tiny']" in listed


def test_two_extensions_of_one_name_are_refused_in_one_line(installed: tuple[Path, dict[str, str]]) -> None:
    root, env = installed
    site = tiny_package.pip_install(tiny_package.clash(root), root / "clash-site")
    env = {**env, "PYTHONPATH": os.pathsep.join([str(site), env["PYTHONPATH"]])}
    done = harness_run(env, "run", "--matrix", str(root / "matrix.yaml"), "--repros", "T100", "--executor", "local",
                       "--out", str(root / "never"))  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "two executors are named 'local'" in line and "ft-regress-clash 0.1" in line and "built into" in line
    assert not (root / "never").exists()


def test_an_installed_executor_declares_its_option_and_every_verb_and_the_plugin_take_it(
    installed: tuple[Path, dict[str, str]],
) -> None:
    root, env = installed
    for verb in ("run", "bisect", "watch", "grid", "crosscheck"):
        helped = harness_run(env, verb, "--help")
        assert helped.returncode == 0 and "--tiny-label" in helped.stdout, verb
        assert "with --executor tiny: a label run.json shows" in " ".join(helped.stdout.split()), verb
    # The pytest plugin takes it (prefixed, as every executor's own); its items are a repro directory's.
    fake_stack.write_repro(root / "plugin-repros", "T2", "clean", "NOT_REPRODUCED", world_size=1)
    out = root / "plugin-out"
    plugin = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", f"--matrix={root / 'matrix.yaml'}",
         f"--repros-dir={root / 'plugin-repros'}", "--repros=T2", "--repro-executor=tiny",
         "--repro-tiny-label=from-pytest", f"--repro-out={out}"],
        capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=300,
    )  # fmt: skip
    assert plugin.returncode == 0 and "1 passed" in plugin.stdout, plugin.stdout + plugin.stderr
    # The session's executor is made from these options, as run's is (whose run.json shows it got them).
    meta = json.loads((out / "run.json").read_text())
    assert meta["options"]["executor"] == "tiny"
    assert meta["options"]["executor_options"] == {"tiny_label": "from-pytest"}


def test_an_executor_option_is_never_dropped_in_silence(installed: tuple[Path, dict[str, str]]) -> None:
    root, env = installed
    matrix = str(root / "matrix.yaml")
    # Given to another executor: refused, naming whose it is, before anything runs.
    done = harness_run(env, "run", "--matrix", matrix, "--repros", "T100", "--tiny-label", "x",
                       "--out", str(root / "never"))  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "--tiny-label: x: is for --executor tiny" in line and not (root / "never").exists()
    # A run whose run.json holds an option no installed executor declares (its package since
    # uninstalled, or a hand edit) is refused on resume, never resumed without it.
    out = root / "resumed"
    first = harness_run(env, "run", "--matrix", matrix, "--repros", "T100", "--executor", "tiny", "--out", str(out))
    assert first.returncode == 0, first.stdout + first.stderr
    meta = json.loads((out / "run.json").read_text())
    meta["options"]["executor_options"] = {"tiny_colour": "red"}
    (out / "run.json").write_text(json.dumps(meta))
    resumed = harness_run(env, "run", "--resume", str(out))
    assert resumed.returncode == 2 and "Traceback" not in resumed.stderr, resumed.stderr
    (line,) = resumed.stderr.strip().splitlines()
    assert "tiny_colour" in line and "no option of any installed executor" in line
