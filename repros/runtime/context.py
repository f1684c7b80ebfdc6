"""What a repro's ``run`` receives on a rank: where it runs and how to measure."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata, util
from pathlib import Path
from typing import Any

from repros.runtime.measures import METERS, Meter
from repros.runtime.record import ImportedPackage
from repros.runtime.spec import TRACKED_PACKAGES


def installed_versions(packages: tuple[str, ...] = TRACKED_PACKAGES) -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in packages:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _distribution_version(name: str, location: str) -> str | None:
    """The version of the distribution ``name`` installed where ``location`` (a module's file) lies:
    the metadata beside the module's own top-level directory, not the first found on ``sys.path``."""
    path = Path(os.path.abspath(location))
    for root in path.parents:
        if (root / name).is_dir() or (root / f"{name}.py").is_file():
            for dist in metadata.distributions(name=name, path=[str(root)]):
                return str(dist.version)
            return None
    return None


def imported_versions(packages: tuple[str, ...] = TRACKED_PACKAGES) -> dict[str, ImportedPackage]:
    """What this process imported of each package, or would import (``sys.path`` as it is): its
    version (from the distribution metadata beside the module, else its ``__version__``), where it
    lies, and whether it was imported. A package nothing can import has ``version`` None.

    This is what a rank's record says its versions are: a passthrough cell's listing reads the
    interpreter's site-packages, while its ranks keep the caller's ``PYTHONPATH``, which may put
    another release first."""
    found: dict[str, ImportedPackage] = {}
    for name in packages:
        module = sys.modules.get(name)
        location: str | None
        if module is not None:
            location = getattr(module, "__file__", None)
        else:
            try:
                spec = util.find_spec(name)
            except (ImportError, ValueError):
                spec = None
            location = spec.origin if spec is not None and spec.origin not in (None, "namespace") else None
        if location is None:
            found[name] = ImportedPackage(imported=module is not None)
            continue
        version = _distribution_version(name, location)
        if version is None and module is not None:
            attribute = getattr(module, "__version__", None)
            version = str(attribute) if attribute is not None else None
        found[name] = ImportedPackage(version=version, path=str(Path(location).parent), imported=module is not None)
    return found


class Meters:
    """Every meter of a rank, driven together by the training loop:

    ``training_begins()`` once right before the first step; around each step's timed
    sections ``resume()`` / ``pause()``; ``end_step()`` after each step."""

    def __init__(self, meters: Sequence[Meter]) -> None:
        self.meters = list(meters)
        #: When the first step began (``time.time()``): with the launch's time, how long the item took
        #: to start training.
        self.training_began_at: float | None = None
        #: When the last step ended (``time.time()``).
        self.training_ended_at: float | None = None

    @classmethod
    def for_device(cls, device: Any) -> Meters:
        return cls([meter(device) for meter in METERS.values()])

    def training_begins(self) -> None:
        if self.training_began_at is None:
            self.training_began_at = time.time()
        for meter in self.meters:
            meter.training_begins()

    def resume(self) -> None:
        for meter in self.meters:
            meter.resume()

    def pause(self) -> None:
        for meter in reversed(self.meters):
            meter.pause()

    def end_step(self) -> None:
        for meter in self.meters:
            meter.end_step()
        self.training_ended_at = time.time()

    def results(self) -> dict[str, Any]:
        """What the rank records under ``measures``: each meter's result by its measure's name."""
        found = {}
        for meter in self.meters:
            result = meter.result()
            if result is not None:
                found[meter.measure.name] = result
        return found


@dataclass
class RankContext:
    rank: int
    local_rank: int
    world_size: int
    device: Any  # torch.device
    backend: str
    steps: int
    warmup_steps: int
    mode: str
    meters: Meters
    #: Facts the scenario reports (training facts, guards applied); written under the rank record's
    #: ``facts``, apart from its own fields.
    facts: dict[str, Any] = field(default_factory=dict)
    #: What the item asks of the rank beyond the repro and the mode (the model size, a grid
    #: scenario, a workaround variant), as the orchestrator sent it.
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def model(self) -> str:
        return str(self.params.get("model") or "tiny")

    @property
    def device_type(self) -> str:
        return str(self.device.type)
