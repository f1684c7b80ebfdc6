"""One item observed: what the launcher saw, classified, checked against the environment."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.config.model import Cell
from harness.config.repros import discover
from harness.environments import Environments, Resolved
from harness.environments.index import IndexConfig
from harness.environments.uv import UvProvider
from harness.execution.launchers import LaunchRequest
from harness.execution.launchers.result import LaunchResult
from harness.pipeline.executors import ExecutorContext, ItemJob
from harness.pipeline.executors.local import LocalExecutor
from harness.planning.items import PlannedItem
from harness.planning.run_options import CacheChoice, ExecutorChoice
from harness.records.item import ItemRecord
from harness.records.run_dir import RunDir
from tests.environments.test_environments import REQUEST, FakeBuilds, site_file
from tests.support.rank_records import rank_record


class DamagingLauncher:
    """A launcher whose 'ranks' run clean but edit a file of the environment on the way."""

    name = "stand-in"

    def __init__(self, damage: bool) -> None:
        self.damage = damage
        self.retired: list[str] = []

    def launch(self, request: LaunchRequest) -> LaunchResult:
        if self.damage:
            with open(site_file(request.env), "a") as fh:
                fh.write("# patched by a repro\n")
        ok: dict[str, Any] = {"device": "cpu", "facts": {"train": {}}}
        records = {r: rank_record(r, "ok", **ok) for r in (0, 1)}
        return LaunchResult(["stand-in"], 0, False, 0.1, 2, dict(records))

    def cell_done(self, env: Any) -> None:
        self.retired.append(env.key)

    def describe(self) -> dict[str, Any]:
        return {}

    def abort(self) -> None:
        pass

    def close(self) -> None:
        pass


CELL = Cell(
    name="c",
    packages=dict(REQUEST.packages),
    lanes=("ci",),
    world_size=2,
    python="3.11",
    timeout_s=60.0,
    exclude_newer=None,
    provider="uv",
    repros=None,
)


def fake_environments(tmp_path: Path) -> Environments:
    builds = FakeBuilds(tmp_path / "cache")
    return Environments(tmp_path / "cache", IndexConfig(), providers={"uv": UvProvider(builder=builds)})


def observe(
    tmp_path: Path, damage: bool, envs: Environments | None = None, launcher: DamagingLauncher | None = None
) -> tuple[ItemRecord, Environments, DamagingLauncher]:
    if envs is None:
        envs = fake_environments(tmp_path)
    cell = CELL
    repro = discover().repros["F1"]
    launcher = launcher or DamagingLauncher(damage)
    context = ExecutorContext(RunDir(tmp_path / "run"), "r", ExecutorChoice(), CacheChoice(), envs)
    job = ItemJob("r", PlannedItem(cell, "F1", repro.module, "bug", 2), repro, "rerun")
    record = LocalExecutor(context, launcher=launcher).attempt(job, envs.for_cell(cell), ()).record
    return record, envs, launcher


def test_a_clean_item_in_a_whole_environment_is_classified(tmp_path: Path) -> None:
    record, _, launcher = observe(tmp_path, damage=False)
    assert record.outcome == "NOT_REPRODUCED" and launcher.retired == []


def test_an_item_that_damages_its_environment_is_infra_naming_the_file_and_forces_a_rebuild(tmp_path: Path) -> None:
    record, envs, launcher = observe(tmp_path, damage=True)
    assert record.outcome == "INFRA"
    assert "changed while the item ran" in record.reasons[0] and "peft/__init__.py was modified" in record.reasons[0]
    assert launcher.retired  # the cell's pre-imported worker holds the old modules: it goes
    # The next item of the cell, in the same run, gets the environment rebuilt first.
    after, _, _ = observe(tmp_path, damage=False, envs=envs)
    assert after.outcome == "NOT_REPRODUCED" and "changed while an item ran" not in str(after.reasons)
    assert after.environment_repaired is not None and "rebuilt" in after.environment_repaired
    assert envs.uv.builds == 2  # type: ignore[attr-defined]
    again: Resolved = envs.for_cell(CELL)
    assert again.env is not None and "patched" not in site_file(again.env).read_text()


def test_an_environment_damaged_between_runs_is_rebuilt_before_the_next_item(tmp_path: Path) -> None:
    envs = fake_environments(tmp_path)
    env = envs.for_cell(CELL).env
    assert env is not None
    with open(site_file(env), "a") as fh:
        fh.write("# edited by hand\n")
    record, _, _ = observe(tmp_path, damage=False, envs=envs)
    assert record.outcome == "NOT_REPRODUCED"
    assert record.environment_repaired is not None and "peft/__init__.py was modified" in record.environment_repaired


class VanishedLauncher(DamagingLauncher):
    """Another run's eviction removed the environment between the item's planning and its start:
    starting the interpreter raises what ``subprocess.Popen`` raises."""

    def launch(self, request: LaunchRequest) -> LaunchResult:
        import shutil

        shutil.rmtree(Path(str(request.env.path)))
        raise FileNotFoundError(2, "No such file or directory", request.env.python)


def test_an_environment_gone_before_the_item_started_is_infra_and_the_run_goes_on(tmp_path: Path) -> None:
    record, envs, launcher = observe(tmp_path, damage=False, launcher=VanishedLauncher(damage=False))
    assert record.outcome == "INFRA" and record.error is not None and record.error.type == "FileNotFoundError"
    assert "changed before the item could start" in record.reasons[0]
    assert launcher.retired  # the cell's worker goes with it
    # The next item gets the environment made again.
    after, _, _ = observe(tmp_path, damage=False, envs=envs)
    assert after.outcome == "NOT_REPRODUCED"
    assert envs.uv.builds == 2  # type: ignore[attr-defined]
