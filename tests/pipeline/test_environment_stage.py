"""The cells' environments are made ready in the background while the items of the cells already
ready run: the first cell's items do not wait for the last cell's build; the order puts the cheapest
first result first, and then the cells with the most items; an interrupt stops the build under way
and reports none of it."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from harness.config.model import Cell
from harness.environments import PROVIDERS, Environment, EnvironmentUnavailable
from harness.environments.base import CellRequest
from harness.execution.launchers import LaunchRequest
from harness.pipeline.environment_stage import build_order
from harness.records.run_dir import RunDir
from tests.support import throwaway_run

#: How long a test waits for what the stage should have done long before.
PATIENCE_S = 30.0


def cell(name: str, **packages: str | None) -> Cell:
    return Cell(
        name=name,
        packages={"torch": "==2.13.0", "deepspeed": "==0.19.8", **packages},
        lanes=("ci",),
        world_size=2,
        python="3.11",
        timeout_s=60.0,
        exclude_newer=None,
        provider="uv",
        repros=None,
    )


def test_ready_environments_first_then_the_cheapest_build_then_the_cells_with_most_items() -> None:
    current = cell("current")
    llava = cell("llava")  # the same environment as current
    tf4 = cell("tf4", transformers="==4.57.6")  # shares current's DeepSpeed op
    old_ds = cell("ds-0.19.2", deepspeed="==0.19.2")  # compiles an op of its own
    small = cell("small", accelerate="==1.7.0")
    built = cell("built", peft="==0.15.0")
    items = {"current": 40, "llava": 2, "tf4": 24, "ds-0.19.2": 30, "small": 2, "built": 1}
    cells = [old_ds, current, llava, tf4, small, built]
    order = build_order(cells, cached=lambda c: c.name == "built", items=items)
    # Built already: a check. Then the first build: of those compiling an op, the most items; its
    # twin at once; then by items (each op is compiled once whatever the order).
    assert [c.name for c in order] == ["built", "current", "llava", "ds-0.19.2", "tf4", "small"]
    # Where a build shares an op an environment already built has, it is the cheapest first result.
    order = build_order(cells, cached=lambda c: c.name == "tf4", items=items)
    assert [c.name for c in order][:3] == ["tf4", "current", "llava"]


class _Gated(throwaway_run.ThrowawayProvider):
    """The throwaway provider whose last cell's environment is ready only once the first cell's first
    item has been launched (or ``cancel`` is called)."""

    first_launched = threading.Event()
    cancelled = threading.Event()
    last = "c2"

    def get(self, cell: CellRequest) -> Environment:
        if cell.name == _Gated.last:
            for _ in range(int(PATIENCE_S * 10)):
                if _Gated.first_launched.is_set():
                    break
                if _Gated.cancelled.wait(0.1):
                    raise EnvironmentUnavailable("cancelled")
            else:
                raise EnvironmentUnavailable("no item ran while this environment was being built")
        return super().get(cell)

    def cancel(self) -> None:
        _Gated.cancelled.set()


@contextmanager
def gated_run(on_launch: Callable[[LaunchRequest], None]) -> Iterator[type[_Gated]]:
    """The throwaway run, its provider gated."""
    _Gated.first_launched.clear()
    _Gated.cancelled.clear()
    with throwaway_run.registered(on_launch=on_launch), pytest.MonkeyPatch.context() as patch:
        patch.setitem(PROVIDERS, throwaway_run.NAME, _Gated)
        yield _Gated


def test_the_first_cells_items_run_while_the_last_cells_environment_is_built(tmp_path: Path) -> None:
    matrix = throwaway_run.write_matrix(tmp_path / "matrix.yaml", ["c0", "c1", "c2"], world_size=1)
    out = tmp_path / "run"

    def launched(request: LaunchRequest) -> None:
        _Gated.first_launched.set()

    with gated_run(on_launch=launched):
        assert throwaway_run.run(matrix, out, tmp_path / "cache") == 1  # no expectation covers them
    records = RunDir(out).records()
    assert [r.cell for r in records] == ["c0", "c1", "c2"]  # cell by cell, as with --jobs 1 always
    assert all(r.outcome != "UNRESOLVABLE" for r in records), [r.reasons for r in records]
    stage = RunDir(out).read_meta().environment_stage
    assert stage is not None and stage["order"] == ["c0", "c1", "c2"] and stage["builders"] >= 1
    # c2's environment was ready only after c0's item had run.
    assert stage["cells"]["c2"]["ready_s"] >= stage["cells"]["c0"]["ready_s"]


def test_an_interrupt_stops_the_build_under_way_and_reports_none_of_it(tmp_path: Path) -> None:
    matrix = throwaway_run.write_matrix(tmp_path / "matrix.yaml", ["c0", "c1", "c2"], world_size=1)
    out = tmp_path / "run"

    def interrupt_at_c1(request: LaunchRequest) -> None:
        if request.cell == "c1":
            os.kill(os.getpid(), signal.SIGTERM)

    with gated_run(on_launch=interrupt_at_c1) as gated:
        assert throwaway_run.run(matrix, out, tmp_path / "cache") == 130
    assert gated.cancelled.is_set()  # c2's build was stopped, not waited for
    assert [r.cell for r in RunDir(out).records()] == ["c0"]  # no UNRESOLVABLE for c2
    assert "c2" not in RunDir(out).read_meta().cells
