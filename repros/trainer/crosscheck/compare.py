"""A strategy's trajectory held against the one-process reference's: the first step and quantity where
they differ by more than the tolerance (``tolerance.py``), and how close the rest came.

Each quantity's relative difference:

* loss, gradient norm: ``|value - reference| / |reference|``;
* a gradient tensor: ``‖g - g_ref‖ / max(‖g‖, ‖g_ref‖)`` (a gradient one side lacks counts as zeros);
* a weight, or a saved adapter tensor: ``‖w - w_ref‖ / max(‖w - w₀‖, ‖w_ref - w₀‖)``, against how far
  training moved it from the initial ``w₀``, so that a lost update shows whole however large the weight;
* a model's outputs (reloaded, merged): ``‖y - y_ref‖ / ‖y_ref - y_base‖``, against what the adapter
  changed in the base model's outputs;
* optimizer steps taken: equal or not.

Non-finite values agree only with the same non-finite value.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from repros.trainer.crosscheck.tolerance import AFTER_QUANTITIES, Tolerance, relative
from repros.trainer.crosscheck.training import Trajectory


@dataclass(frozen=True)
class Difference:
    """One quantity of one step (or of what training left) held against the reference."""

    step: int
    quantity: str
    tensor: str | None
    value: float | str | None
    reference: float | str | None
    rel_diff: float
    tolerance: float

    @property
    def diverges(self) -> bool:
        if math.isnan(self.rel_diff):
            return True
        return self.rel_diff > self.tolerance

    @property
    def ratio(self) -> float:
        """How much of its tolerance the difference took (``inf`` where a count differs)."""
        if self.tolerance > 0:
            return self.rel_diff / self.tolerance
        return 0.0 if self.rel_diff == 0 else math.inf

    def as_json(self) -> dict[str, Any]:
        return {k: _json(v) for k, v in asdict(self).items()}

    def describe(self) -> str:
        where = f" of {self.tensor}" if self.tensor else ""
        at = f"at step {self.step}" if self.quantity not in AFTER_QUANTITIES else "after training"
        return (
            f"{self.quantity}{where} {at}: {_show(self.value)} against the reference's {_show(self.reference)}, "
            f"relative difference {_show(self.rel_diff)} > tolerance {_show(self.tolerance)}"
        )


def _json(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _norm(tensor: Any) -> float:
    return float(tensor.double().norm()) if tensor is not None else 0.0


def _scalar(step: int, quantity: str, value: float, reference: float, tolerance: Tolerance) -> Difference:
    if not (math.isfinite(value) and math.isfinite(reference)):
        same = (math.isnan(value) and math.isnan(reference)) or value == reference
        rel = 0.0 if same else math.inf
    else:
        rel = relative(abs(value - reference), abs(reference))
    return Difference(step, quantity, None, value, reference, rel, tolerance.of(quantity, step))


def _zeros_like(other: Any) -> Any:
    return None if other is None else other.new_zeros(other.shape)


def _tensor(
    step: int,
    quantity: str,
    name: str,
    value: Any,
    reference: Any,
    tolerance: Tolerance,
    origin: Any = None,
    stored: str = "fp32",
) -> Difference:
    """A tensor held against the reference's; with ``origin`` (the initial weight) relative to the update,
    the weight stored in ``stored``."""
    if value is None and reference is None:
        return Difference(step, quantity, name, None, None, 0.0, tolerance.of(quantity, step))
    value = _zeros_like(reference) if value is None else value
    reference = _zeros_like(value) if reference is None else reference
    if tuple(value.shape) != tuple(reference.shape):
        return Difference(
            step, quantity, name, f"shape {list(value.shape)}", f"shape {list(reference.shape)}", math.inf, 0.0
        )
    finite_value, finite_reference = bool(value.isfinite().all()), bool(reference.isfinite().all())
    if not (finite_value and finite_reference):
        rel = 0.0 if finite_value == finite_reference and bool((value.isnan() == reference.isnan()).all()) else math.inf
        shown = (_norm(value) if finite_value else "non-finite", _norm(reference) if finite_reference else "non-finite")
        return Difference(step, quantity, name, shown[0], shown[1], rel, tolerance.of(quantity, step))
    stored_ratio = 0.0
    if origin is not None:
        moved, moved_ref = value - origin, reference - origin
        scale = max(_norm(moved), _norm(moved_ref))
        shown_value, shown_reference = _norm(moved), _norm(moved_ref)
        stored_ratio = relative(_norm(reference), scale)
    else:
        scale = max(_norm(value), _norm(reference))
        shown_value, shown_reference = _norm(value), _norm(reference)
    rel = relative(_norm(value - reference), scale)
    allowed = tolerance.of(quantity, step, stored_ratio, stored)
    return Difference(step, quantity, name, shown_value, shown_reference, rel, allowed)


def step_differences(strategy: Trajectory, reference: Trajectory, tolerance: Tolerance) -> Iterator[Difference]:
    """Every quantity of every step, in the order they are judged (a step's loss, its optimizer steps, its
    gradient norm, each gradient, each weight; then the next step)."""
    names = list(reference.initial)
    for name in strategy.initial:
        if name not in names:
            names.append(name)
    for name in names:
        yield _tensor(0, "initial_weight", name, strategy.initial.get(name), reference.initial.get(name), tolerance)
    for step in range(max(len(strategy.losses), len(reference.losses))):
        if step >= len(strategy.losses) or step >= len(reference.losses):
            yield Difference(step, "steps_trained", None, len(strategy.losses), len(reference.losses), math.inf, 0.0)
            return
        yield _scalar(step, "loss", strategy.losses[step], reference.losses[step], tolerance)
        taken, taken_ref = strategy.optimizer_steps[step], reference.optimizer_steps[step]
        yield Difference(step, "optimizer_steps", None, taken, taken_ref, 0.0 if taken == taken_ref else math.inf, 0.0)
        yield _scalar(step, "grad_norm", strategy.grad_norms[step], reference.grad_norms[step], tolerance)
        for name in names:
            yield _tensor(
                step,
                "gradient",
                name,
                strategy.gradients[step].get(name),
                reference.gradients[step].get(name),
                tolerance,
            )
        for name in names:
            yield _tensor(
                step,
                "weight",
                name,
                strategy.weights[step].get(name),
                reference.weights[step].get(name),
                tolerance,
                origin=reference.initial.get(name),
            )


def after_differences(
    saved: Mapping[str, Any],
    reference_final: Mapping[str, Any],
    reference_initial: Mapping[str, Any],
    outputs: Mapping[str, tuple[Any, Any, Any]],
    tolerance: Tolerance,
    last_step: int,
    stored: str = "fp32",
) -> Iterator[Difference]:
    """What training left: each saved adapter tensor (as reloaded; saved in ``stored``) against the reference's
    final weight, then each model's outputs (``outputs``: quantity -> (outputs, reference's, base model's))."""
    for name, final in reference_final.items():
        value = saved.get(name)
        if value is None:
            yield Difference(last_step, "saved_adapter", name, "missing", _norm(final), math.inf, 0.0)
            continue
        yield _tensor(
            last_step,
            "saved_adapter",
            name,
            value,
            final,
            tolerance,
            origin=reference_initial.get(name),
            stored=stored,
        )
    for quantity, (value, reference, base) in outputs.items():
        difference = _norm(value - reference)
        scale = _norm(reference - base)
        allowed = tolerance.of(quantity, last_step, relative(_norm(reference), scale), stored)
        yield Difference(last_step, quantity, None, _norm(value - base), scale, relative(difference, scale), allowed)


@dataclass(frozen=True)
class Verdict:
    """The first difference beyond its tolerance (None: the strategy agrees), and the closest call."""

    divergence: Difference | None
    closest: Difference | None
    compared: int

    def as_json(self) -> dict[str, Any]:
        return {
            "divergence": self.divergence.as_json() if self.divergence else None,
            "closest": self.closest.as_json() if self.closest else None,
            "closest_ratio": _json(self.closest.ratio) if self.closest else None,
            "compared": self.compared,
        }


def judge(differences: Iterator[Difference]) -> Verdict:
    first: Difference | None = None
    closest: Difference | None = None
    compared = 0
    for difference in differences:
        compared += 1
        if first is None and difference.diverges:
            first = difference
        if difference.tolerance > 0 and (closest is None or difference.ratio > closest.ratio):
            closest = difference
    return Verdict(first, closest, compared)
