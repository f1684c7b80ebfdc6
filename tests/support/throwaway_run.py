"""A real ``run`` (the command line, the session, dispatch, classification, records, reports)
with nothing heavy under it: a provider that hands out this interpreter and a launcher whose
"ranks" write the rank records a test asks for, the way ``repros/runtime/rank_main.py`` writes
them (``write_rank_record``, the repro's facts under ``facts``).

``ranks_for`` (a launcher attribute) decides what each item's ranks recorded, by cell name;
``on_launch`` runs before (to send a signal, to count). Register both with ``registered``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from harness.cli.main import main
from harness.environments import PROVIDERS, Environment
from harness.environments.base import CellRequest, ProviderContext
from harness.execution.launchers import LAUNCHERS, LauncherContext, LaunchRequest
from harness.execution.launchers.result import LaunchResult, collect_item
from repros.runtime.record import write_rank_record

NAME = "throwaway"

RankWrites = Callable[[str, int], dict[str, Any]]


def clean_rank(cell: str, rank: int) -> dict[str, Any]:
    """What a rank of a clean bug-mode run records."""
    return {"rank": rank, "status": "ok", "phase": "run", "device": "cpu", "backend": "none", "facts": {}}


class ThrowawayProvider:
    """This interpreter, as it is (no torch needed: the throwaway launcher runs nothing)."""

    name: ClassVar[str] = NAME
    installs_packages: ClassVar[bool] = False

    def __init__(self, context: ProviderContext) -> None:
        self.cache_dir = context.cache_dir

    def get(self, cell: CellRequest) -> Environment:
        return Environment(
            key=NAME,
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

    def readiness(self, env: Environment) -> str:
        return "made ready by the throwaway provider"

    @classmethod
    def rank_import_path(cls, env: Environment) -> list[str]:
        return []


class ThrowawayLauncher:
    """Writes the rank records ``ranks_for`` says, as ranks would have; launches nothing."""

    name = NAME
    ranks_for: ClassVar[RankWrites] = staticmethod(clean_rank)
    on_launch: ClassVar[Callable[[LaunchRequest], None] | None] = None
    launched: ClassVar[list[str]] = []

    def __init__(self, context: LauncherContext) -> None:
        self.context = context

    def launch(self, request: LaunchRequest) -> LaunchResult:
        if ThrowawayLauncher.on_launch is not None:
            ThrowawayLauncher.on_launch(request)
        ThrowawayLauncher.launched.append(request.cell)
        request.item_dir.mkdir(parents=True, exist_ok=True)
        exitcodes = {}
        for rank in range(request.world_size):
            record = ThrowawayLauncher.ranks_for(request.cell, rank)
            write_rank_record(request.item_dir, rank, record)
            exitcodes[rank] = 1 if record.get("status") == "error" else 0
        failed = any(exitcodes.values())
        return collect_item(
            [NAME],
            request.item_dir,
            request.world_size,
            1 if failed else 0,
            False,
            0.1,
            [],
            rank_exitcodes=exitcodes,
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


@contextmanager
def registered(
    ranks_for: RankWrites = clean_rank, on_launch: Callable[[LaunchRequest], None] | None = None
) -> Iterator[None]:
    """The throwaway provider and launcher registered (as a plugin would) for the block."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(PROVIDERS, ThrowawayProvider.name, ThrowawayProvider)
        patch.setitem(LAUNCHERS, ThrowawayLauncher.name, ThrowawayLauncher)
        patch.setattr(ThrowawayLauncher, "ranks_for", staticmethod(ranks_for))
        patch.setattr(ThrowawayLauncher, "on_launch", on_launch)
        patch.setattr(ThrowawayLauncher, "launched", [])
        yield


def write_matrix(path: Path, cells: Sequence[str], world_size: int = 2) -> Path:
    """A matrix of ``cells``, each of the throwaway provider, in lane ``ci``."""
    path.write_text(
        yaml.safe_dump(
            {
                "version": 1,
                "lanes": {"ci": "the test's"},
                "cells": {c: {"provider": NAME, "lanes": ["ci"], "world_size": world_size} for c in cells},
            }
        )
    )
    return path


def run(matrix: Path, out: Path, cache: Path, *more: str, repros: str = "F1", modes: str = "bug") -> int:
    """``run`` over ``matrix`` into ``out`` with the throwaway launcher; its exit status."""
    return main(
        [
            "run",
            "--matrix",
            str(matrix),
            "--repros",
            repros,
            "--modes",
            modes,
            "--launcher",
            NAME,
            "--out",
            str(out),
            "--cache-dir",
            str(cache),
            *more,
        ]
    )


def resume(out: Path) -> int:
    return main(["run", "--resume", str(out)])
