"""--by-date: days resolve to package sets; equal sets are one observation."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from harness.config.matrix import load_matrix
from harness.config.repros import discover
from harness.environments import Environment, Resolved
from harness.environments.base import EnvRequest
from harness.environments.locks import Lock
from harness.environments.specs import NEWEST
from harness.pipeline.executors import local as local_executor
from harness.planning.run_options import CacheChoice, RunOptions
from harness.records.item import ItemRecord, parse_record
from harness.workflows.bisect import runner as bisect_mod
from harness.workflows.bisect.runner import BisectOptions, DateAxis, execute_bisect
from repros.runtime.spec import MODES
from tests.support.paths import REPO_ROOT

FIRST_BAD_DAY = dt.date(2026, 3, 10)


class FakeResolver:
    """deepspeed moves from 0.19.1 to 0.19.2 on FIRST_BAD_DAY; peft moves earlier."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def lock(self, request: EnvRequest) -> Lock:
        assert request.as_of is not None
        self.calls.append(request.as_of)
        day = dt.date.fromisoformat(request.as_of) - dt.timedelta(days=1)
        # torch held at its spec, every other package of the cell floating
        assert request.packages["torch"] == "==2.13.0" and request.packages["deepspeed"] == NEWEST
        versions = {
            "torch": "2.13.0",
            "deepspeed": "0.19.2" if day >= FIRST_BAD_DAY else "0.19.1",
            "peft": "0.21.0" if day >= dt.date(2026, 2, 1) else "0.20.0",
            "transformers": "5.23.0",
            "accelerate": "1.15.0",
            "bitsandbytes": "0.50.2",
            "numpy": "2.3.0",
        }
        lines = tuple(sorted(f"{name}=={version}" for name, version in versions.items()))
        return Lock(lines, request.as_of, "2026-11-25T00:00:00+00:00", 0.5)


def test_date_axis_pins_the_resolution_and_names_what_changed() -> None:
    matrix = load_matrix(REPO_ROOT / "matrix.yaml", known_repros=discover().repros.keys(), known_modes=MODES)
    resolver = FakeResolver()
    axis = DateAxis(matrix.cells["current"], resolver, hold=("torch",))
    cell = axis.cell(matrix.cells["current"], "2026-03-10")
    # The day's environment is its lock: the end of the day, every dependency with it.
    assert resolver.calls == ["2026-03-11"]
    assert cell.packages["deepspeed"] == "==0.19.2" and cell.lock is not None and "numpy==2.3.0" in cell.lock
    assert cell.origin == "current" and cell.as_of is None
    assert axis.identity("2026-02-02") == axis.identity("2026-03-09") != axis.identity("2026-03-10")
    assert axis.moved_on("2026-03-10") == {"deepspeed": ("0.19.1", "0.19.2")}


def test_by_date_bisect_names_the_day_and_the_changed_package(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    resolver = FakeResolver()
    runs: list[dict[str, str]] = []

    class FakeEnvironments:
        """Resolution by the fake resolver; every cell's environment made up from its pins."""

        def __init__(self, cache_dir: Path, **_: Any) -> None:
            self.uv = resolver

        def release(self, env: Environment) -> None:
            pass

        def cached(self, cell: Any) -> bool:
            return True

        def for_cell(self, cell: Any) -> Resolved:
            packages = {k: v.lstrip("=") for k, v in cell.packages.items()}
            return Resolved(Environment(cell.name, "py", "3.11.7", packages, "/e", "/x", False, 1.0))

    def fake_observe(job: Any, resolved: Resolved, *_: Any, **__: Any) -> ItemRecord:
        item = job.item
        env = resolved.env
        assert env is not None
        runs.append(env.packages)
        reproduced = env.packages["deepspeed"] == "0.19.2"
        return parse_record(
            {
                "schema_version": 1,
                "run_id": "RUN",
                "cell": item.cell.name,
                "repro": item.repro_id,
                "mode": item.mode,
                "outcome": "REPRODUCED" if reproduced else "NOT_REPRODUCED",
                "signature": "F1.recompute-shape-0" if reproduced else None,
                "expected": None,
                "matched": True,
                "versions": dict(env.packages),
                "world_size": 2,
                "device": "cpu",
                "wall_s": 1.0,
                "error": None,
                "reasons": [],
                "guards": [],
                "env": {"key": env.key, "path": "/e", "python": "/x", "reused": False, "build_s": 1},
                "repro_cmd": "python -m harness run",
                "started_at": "2026-01-01T00:00:00Z",
                "finished_at": "2026-01-01T00:00:01Z",
            }
        )

    monkeypatch.setattr(bisect_mod, "Environments", FakeEnvironments)
    monkeypatch.setattr(local_executor, "observe_item", fake_observe)
    discovery = discover()
    matrix = load_matrix(REPO_ROOT / "matrix.yaml", known_repros=discovery.repros.keys(), known_modes=MODES)
    opts = BisectOptions(
        run=RunOptions(matrix, discovery, cache=CacheChoice(resolved=tmp_path), out_dir=tmp_path / "out"),
        repro="F1",
        mode="bug",
        package=None,
        good="2026-01-01",
        bad="2026-04-30",
        by_date=True,
        hold=("torch",),
    )
    code = execute_bisect(opts, Console(file=open(tmp_path / "console.txt", "w")))
    final = capsys.readouterr().out.strip().splitlines()[-1]
    assert code == 0
    assert final == "first bad: 2026-03-10 (deepspeed 0.19.1 -> 0.19.2)"
    # 120 days, but only as many runs as distinct resolutions probed (at most 3 here).
    assert len(runs) <= 3
    assert len({tuple(sorted(r.items())) for r in runs}) == len(runs)
