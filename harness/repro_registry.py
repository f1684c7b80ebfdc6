"""Finds the repros: every module file directly in the ``repros`` package.

A repro module declares ``SPEC`` (a ``repros.common.spec.ReproSpec``) and a
``run(ctx)`` function, and keeps heavy imports inside functions, so importing it
here costs nothing and never pulls in torch.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass

import repros
from repros.common.spec import ReproSpec


@dataclass(frozen=True)
class Repro:
    spec: ReproSpec
    module: str

    @property
    def id(self) -> str:
        return self.spec.id


@dataclass(frozen=True)
class Discovery:
    repros: dict[str, Repro]
    #: Modules that could not be imported or lack a SPEC, with the reason.
    broken: dict[str, str]


def discover() -> Discovery:
    found: dict[str, Repro] = {}
    broken: dict[str, str] = {}
    for info in sorted(pkgutil.iter_modules(repros.__path__), key=lambda i: i.name):
        if info.ispkg or info.name.startswith("_"):
            continue
        name = f"repros.{info.name}"
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - a user's repro file may be broken
            broken[name] = f"{type(exc).__name__}: {exc}"
            continue
        spec = getattr(module, "SPEC", None)
        if not isinstance(spec, ReproSpec) or not callable(getattr(module, "run", None)):
            broken[name] = "defines no SPEC (ReproSpec) and run(ctx)"
            continue
        if spec.id in found:
            broken[name] = f"repro id {spec.id!r} already taken by {found[spec.id].module}"
            continue
        found[spec.id] = Repro(spec=spec, module=name)
    return Discovery(repros=found, broken=broken)
