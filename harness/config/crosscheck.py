"""``crosscheck:`` as the matrix declares it, validated: which strategies each lane holds against one process.

::

    crosscheck:
      steps: 4                                  # optimizer steps each strategy trains (default 4)
      axes: {optimizer: [sgd, adamw]}           # the values each axis takes (default: every value, SGD only)
      lanes:
        ci: [ddp-fp32, "zero*-fp32", zero3-bf16-ckpt-nr]   # strategy names or patterns
        nightly: pairwise                       # every pair of axis values in some strategy (or: product)
        perf: {strategies: [zero3-bf16], cells: [current]}   # only in these cells of the lane

``run`` holds a lane's crosscheck items beside its repros' only where the section names the lane; the
``crosscheck`` verb covers every pair of the axes' values (``pairwise``) in a lane it does not name, and in
every lane of a matrix without the section.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core.errors import UserError
from repros.trainer.crosscheck.strategy import AXES, UnknownStrategy, parse

COVERAGES = ("pairwise", "product")
DEFAULT_STEPS = 4
#: The axes' values a matrix that says nothing covers: every value, and plain SGD (the comparison's sharpest:
#: AdamW and bitsandbytes' AdamW8bit are named where wanted).
DEFAULT_AXES: dict[str, tuple[str, ...]] = {**AXES, "optimizer": ("sgd",)}


@dataclass(frozen=True)
class CrosscheckConfig:
    axes: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: dict(DEFAULT_AXES))
    #: Lane -> ``pairwise``, ``product``, or strategy names and patterns.
    lanes: Mapping[str, str | tuple[str, ...]] = field(default_factory=dict)
    #: Lane -> the only cells of the lane that run its strategies (a lane not here: every cell).
    cells: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    steps: int = DEFAULT_STEPS

    def selection(self, lane: str | None) -> str | tuple[str, ...]:
        return self.lanes.get(lane or "", "pairwise")

    def runs_in(self, lane: str | None, cell: str) -> bool:
        """Whether the lane's strategies run in ``cell`` (a matrix cell's name)."""
        only = self.cells.get(lane or "")
        return only is None or cell in only


def load_crosscheck(path: Path, raw: Any, lanes: Sequence[str], cells: Sequence[str] = ()) -> CrosscheckConfig:
    """The section as declared (None: the defaults); every error names the field and the fix."""
    if raw is None:
        return CrosscheckConfig()
    where = "crosscheck"
    axes = dict(DEFAULT_AXES)
    for axis, values in (raw.get("axes") or {}).items():
        if axis not in AXES:
            raise UserError(
                path, f"{where}.axes.{axis}", "is not an axis of a strategy", f"use one of: {', '.join(AXES)}"
            )
        unknown = [v for v in values if v not in AXES[axis]]
        if unknown:
            raise UserError(
                path,
                f"{where}.axes.{axis}",
                f"{unknown[0]!r} is not a value of {axis}",
                f"use some of: {', '.join(AXES[axis])}",
            )
        axes[axis] = tuple(values)
    chosen: dict[str, str | tuple[str, ...]] = {}
    only: dict[str, tuple[str, ...]] = {}
    for lane, value in (raw.get("lanes") or {}).items():
        if lane not in lanes:
            raise UserError(
                path, f"{where}.lanes.{lane}", "names no lane of the matrix", f"use one of: {', '.join(lanes)}"
            )
        if isinstance(value, dict):
            only[lane] = tuple(value.get("cells") or ())
            unknown = [c for c in only[lane] if c not in cells]
            if unknown:
                raise UserError(
                    path,
                    f"{where}.lanes.{lane}.cells",
                    f"names no cell {unknown[0]!r}",
                    f"use some of: {', '.join(cells)}",
                )
            value = value.get("strategies", "pairwise")
        if isinstance(value, str):
            if value not in COVERAGES:
                raise UserError(
                    path,
                    f"{where}.lanes.{lane}",
                    f"{value!r} is no coverage",
                    "write pairwise, product, or a list of strategies",
                )
            chosen[lane] = value
            continue
        for name in value:
            if "*" in name or "?" in name or "[" in name:
                continue  # a pattern: checked against the strategies when planned
            try:
                parse(name)
            except UnknownStrategy as exc:
                raise UserError(
                    path, f"{where}.lanes.{lane}", str(exc), "write a strategy's name as crosscheck --list prints it"
                ) from None
        chosen[lane] = tuple(value)
    steps = raw.get("steps", DEFAULT_STEPS)
    return CrosscheckConfig(axes=axes, lanes=chosen, cells=only, steps=int(steps))
