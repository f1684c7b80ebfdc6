"""What a measure is, on both sides of the process boundary. Standard library only.

A ``Meter`` runs in a rank (torch imported lazily, inside its methods): the trainer calls
``training_begins`` right before the first step and brackets the timed sections of each step
with ``resume``/``pause``, then ``end_step``; ``result`` is what the rank records under
``measures.<name>``. The ``Measure`` it declares tells the orchestrator how to merge the
ranks' results into the item record (``harness/execution/metrics.py``): a single figure per rank
(``kind`` and ``value``) merged as the maximum over ranks, or a figure per step (``kind`` and
``per_step``) merged step by step as the slowest rank, then summarised over the steps after
warm-up (median, min, max, interquartile range, count); and every display (the terminal table,
the HTML report, compare, costs) what it is: its quantity, its label, whether it is a headline.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar


class Quantity(StrEnum):
    """What a figure measures, so a display knows how to print and compare it."""

    #: Bytes.
    MEMORY = "memory"
    #: Seconds per step.
    TIME = "time"


class Reduction(StrEnum):
    #: One figure per rank (``{"kind", "value"}``): the item's is the largest.
    MAX_OVER_RANKS = "max_over_ranks"
    #: One figure per step (``{"kind", "per_step"}``): a step lasts as long as its slowest rank.
    SLOWEST_RANK_PER_STEP = "slowest_rank_per_step"


@dataclass(frozen=True)
class Measure:
    #: Key under the rank record's ``measures``.
    name: str
    #: The item record's field for the merged figure.
    field: str
    #: The item record's field saying what kind of figure it is (how it was taken), if any.
    kind_field: str | None
    reduction: Reduction
    description: str
    quantity: Quantity
    #: How a display names the figure ("training peak", "CPU").
    label: str
    #: Where a record has several figures of one quantity, a display's headline figure is the
    #: one with the lowest rank that was measured (compared only with a figure taken the same
    #: way); None: shown in an item's details only.
    headline: int | None = None
    #: Kinds of this figure comparable only between records of the same launcher (a rank forked
    #: from a pre-imported worker never touches the pages of imports it does not use).
    launcher_dependent_kinds: tuple[str, ...] = ()


class Meter:
    """One rank's meter for one measure; every hook is optional."""

    measure: ClassVar[Measure]

    def __init__(self, device: Any) -> None:
        #: A ``torch.device`` (anything with a ``.type``): ``cpu`` or ``cuda``.
        self.device = device

    @property
    def device_type(self) -> str:
        return str(getattr(self.device, "type", self.device))

    def training_begins(self) -> None:
        """Right before the first step (after the model, the engine and the batch exist)."""

    def resume(self) -> None:
        """A timed section of a step starts."""

    def pause(self) -> None:
        """A timed section of a step ends."""

    def end_step(self) -> None:
        """The step is over."""

    def result(self) -> dict[str, Any] | None:
        """What the rank records (``None``: nothing measured)."""
        return None
