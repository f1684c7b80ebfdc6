"""Finds the repros: every module file directly in the ``repros`` package, plus the
``*.py`` files of any user directories (``--repros-dir``, ``FT_REGRESS_REPROS``).

A repro module declares ``SPEC`` (a ``repros.common.spec.ReproSpec``) and a
``run(ctx)`` function, and keeps heavy imports inside functions, so importing it
here costs nothing and never pulls in torch. A module that cannot be imported, or
lacks them, is reported as broken under its file's stem, never silently dropped.
"""

from __future__ import annotations

import os
import pkgutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import repros
from repros.common.loading import load_repro_module
from repros.common.spec import ReproSpec

REPROS_PATH_ENV = "FT_REGRESS_REPROS"


@dataclass(frozen=True)
class Repro:
    spec: ReproSpec
    #: A dotted module name, or the path of a user's repro file.
    module: str

    @property
    def id(self) -> str:
        return self.spec.id


@dataclass(frozen=True)
class BrokenRepro:
    id: str
    module: str
    reason: str


@dataclass(frozen=True)
class Discovery:
    repros: dict[str, Repro]
    #: Modules that could not be imported or lack a SPEC, by their file's stem.
    broken: dict[str, BrokenRepro]


def _candidates(extra_dirs: Sequence[Path]) -> Iterable[tuple[str, str]]:
    for info in sorted(pkgutil.iter_modules(repros.__path__), key=lambda i: i.name):
        if not info.ispkg and not info.name.startswith("_"):
            yield info.name, f"repros.{info.name}"
    for directory in extra_dirs:
        for path in sorted(Path(directory).glob("*.py")):
            if not path.name.startswith("_"):
                yield path.stem, str(path.resolve())


def user_dirs_from_env() -> list[Path]:
    return [Path(p) for p in os.environ.get(REPROS_PATH_ENV, "").split(os.pathsep) if p]


def discover(extra_dirs: Sequence[Path] = ()) -> Discovery:
    found: dict[str, Repro] = {}
    broken: dict[str, BrokenRepro] = {}
    for stem, ref in _candidates([*extra_dirs, *user_dirs_from_env()]):
        try:
            module = load_repro_module(ref)
        except BaseException as exc:  # noqa: BLE001 - a user's repro file may be broken in any way
            if isinstance(exc, KeyboardInterrupt):
                raise
            broken[stem] = BrokenRepro(stem, ref, f"cannot be imported: {type(exc).__name__}: {exc}")
            continue
        spec = getattr(module, "SPEC", None)
        if not isinstance(spec, ReproSpec) or not callable(getattr(module, "run", None)):
            broken[stem] = BrokenRepro(stem, ref, "defines no SPEC (a ReproSpec) and run(ctx)")
            continue
        if spec.id in found:
            broken[stem] = BrokenRepro(stem, ref, f"repro id {spec.id!r} is already taken by {found[spec.id].module}")
            continue
        found[spec.id] = Repro(spec=spec, module=ref)
    return Discovery(repros=found, broken=broken)
