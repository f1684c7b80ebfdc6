"""What a repro's ``run`` receives on a rank: where it runs and how to measure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from repros.runtime.measures import METERS, Meter

TRACKED_PACKAGES = ("torch", "deepspeed", "peft", "transformers", "accelerate", "bitsandbytes")


def installed_versions(packages: tuple[str, ...] = TRACKED_PACKAGES) -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in packages:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


class Meters:
    """Every meter of a rank, driven together by the training loop:

    ``training_begins()`` once right before the first step; around each step's timed
    sections ``resume()`` / ``pause()``; ``end_step()`` after each step."""

    def __init__(self, meters: Sequence[Meter]) -> None:
        self.meters = list(meters)

    @classmethod
    def for_device(cls, device: Any) -> Meters:
        return cls([meter(device) for meter in METERS.values()])

    def training_begins(self) -> None:
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
