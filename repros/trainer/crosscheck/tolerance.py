"""How far a strategy may stray from the one-process reference and still train the same adapter.

Standard library only. The bound comes from the precision and the reduction order, not from a number
picked until the tests pass (docs/crosscheck.md says the same in prose, with what proved it):

* Every quantity compared is computed twice, by the strategy and by the reference, from the same
  inputs, the same initial weights and the same ordered data. What may differ is the order of the
  floating-point reductions: the ranks' micro-batches are reduced by an all-reduce (and accumulated
  micro-batch by micro-batch) where the reference sums one batch; a sharded matmul or a recomputed
  (checkpointed) forward may block its sums differently. A sum of ``n`` terms computed in two orders
  differs, relative to the sum of the terms' magnitudes, by at most ``2 γ_n`` with ``γ_n = n u / (1 - n u)``
  (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., §4.2); with rounding errors that are
  independent and of either sign, as they are here, by about ``√n u`` (ibid., §2.8). The reductions here are
  over the ``R`` products a gradient element sums: each of the global batch's tokens through a layer of
  width ``h``, so ``R = tokens × h``.
* Where the compute runs in bf16 (autocast, or bf16 weights), a reordered sum can round one bf16 result the
  other way: a relative difference of one bf16 unit, ``u_bf16 = 2^-8``, whatever ``R`` is. That term replaces
  nothing of float32's and adds to it.
* The optimizer carries a difference of one step into the next one's weights, and the next forward into
  its gradient: over the steps compared, the difference grows at most linearly in the step (``s + 1``) to
  first order, which is what a few steps of a tiny model show.
* Each compared quantity passes these through a different number of operations, which ``κ`` counts: the
  loss is one reduction past the logits (``κ = 2``); a gradient norm one more (``κ = 4``); a gradient
  tensor, a weight after the optimizer step (measured against how far the reference moved it, so an update
  lost shows whole), and a model's outputs (measured against what training changed in them) a few more
  (``κ = 8``).

* A weight is stored, after each step, in a precision of its own (float32 master weights; a saved adapter
  in the dtype it was saved in): storing it rounds it by one unit of that precision *of the weight's own
  magnitude*, whatever the update was. Measured against the update, that is ``u_stored · ‖w‖ / ‖Δw‖`` a
  step, which matters where a large weight moves little (a LoRA ``A`` whose ``B`` is still near zero). A
  model's outputs are computed in float32 from such weights: one float32 unit of the outputs' magnitude
  against what the adapter changed in them (``u_fp32 · ‖y‖ / ‖Δy‖``), and the adapter's own rounding where it
  was saved in a narrower dtype (``κ · u_stored``: its effect on the outputs is in proportion to its weights).
* An adaptive optimizer (AdamW) divides each element's step by the root of its own squared gradients, so an
  element whose gradient lies within rounding of zero may be stepped anywhere in ``±lr``. With the elements'
  gradients spread smoothly around zero, the share of such elements is about the gradient's relative rounding
  ``ε_g``, and their steps, against the whole update, about ``2 √ε_g``. In float32 only the reduction order
  differs, ``ε_g = (s + 1) · u_fp32 · √R``; bf16 compute rounds every element on its own, up to the gradient's
  own tolerance, ``ε_g = (s + 1) · (κ_gradient · u_bf16 + u_fp32 · √R)``.
  The elements stepped differently move the next step's gradients, gradient norm and loss with them, by as
  much against theirs. Plain SGD (the strategies' default optimizer) has no such term: a difference of a
  gradient reaches the weights in proportion, which is why it is the default.

So a quantity ``q`` at step ``s`` agrees when its relative difference is at most::

    τ(q, s) = κ_q · (s + 1) · (u_compute + u_fp32 · √R)
              + (s + 1) · u_stored · ‖w‖ / ‖Δw‖                   (weights, saved adapters)
              + (s + 1) · u_fp32 · ‖y‖ / ‖Δy‖ + κ_q · u_stored     (outputs; the second term where saved narrower)
              + 2 · √ε_g(s)                                       (weights under an adaptive optimizer;
                                                                   loss and gradients at s + 1)

with ``u_fp32 = 2^-24`` and ``u_compute`` the compute precision's unit (``0`` for float32, ``2^-8`` for bf16).
A count (optimizer steps taken) must be equal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Unit roundoff of each floating-point format (half the distance from 1 to the next number).
UNIT_ROUNDOFF = {"fp32": 2.0**-24, "bf16": 2.0**-8}

#: How many operations past the compared reductions each quantity is (see the module's docstring).
KAPPA = {
    "initial_weight": 2.0,
    "loss": 2.0,
    "grad_norm": 4.0,
    "gradient": 8.0,
    "weight": 8.0,
    "saved_adapter": 8.0,
    "reloaded_outputs": 8.0,
    "merged_outputs": 8.0,
}
#: Quantities that are counts: equal, or diverged.
EXACT = ("optimizer_steps",)
#: Quantities measured against how far training moved them, which storing them rounds (see above).
STORED = ("weight", "saved_adapter")
#: A model's outputs, computed in float32 from the saved adapter.
OUTPUTS = ("reloaded_outputs", "merged_outputs")
#: Quantities an adaptive optimizer's per-element normalisation reaches.
STEPPED = ("weight", "saved_adapter")
#: The order quantities are judged in, for one step: the first that diverges is the one reported (before
#: the first step, each weight as the strategy begins from it).
STEP_QUANTITIES = ("loss", "optimizer_steps", "grad_norm", "gradient", "weight")
#: What is judged once training has ended.
AFTER_QUANTITIES = ("saved_adapter", "reloaded_outputs", "merged_outputs")


@dataclass(frozen=True)
class Tolerance:
    """The bound for one regime and one global batch (``repros/trainer/crosscheck/strategy.py``'s regimes)."""

    #: ``fp32``, ``bf16-autocast`` or ``bf16-weights``.
    regime: str
    #: Tokens of the global batch one optimizer step sums over (every rank, every micro-batch).
    tokens: int
    #: The widest reduction inside a layer (the model's hidden or MLP width).
    width: int
    #: Whether the optimizer normalises each element's step (AdamW and its 8-bit form).
    adaptive: bool = False

    @property
    def compute_unit(self) -> float:
        return 0.0 if self.regime == "fp32" else UNIT_ROUNDOFF["bf16"]

    @property
    def reduction_unit(self) -> float:
        return UNIT_ROUNDOFF["fp32"] * math.sqrt(max(1, self.tokens * self.width))

    def of(self, quantity: str, step: int = 0, stored_ratio: float = 0.0, stored: str = "fp32") -> float:
        """The largest relative difference of ``quantity`` at ``step`` (0-based; quantities judged after
        training are judged at the last step) that still agrees; 0 for a count. ``stored_ratio`` is
        ``‖value‖ / ‖change‖`` of a stored quantity, ``stored`` the precision it was stored in."""
        if quantity in EXACT:
            return 0.0
        if quantity == "initial_weight":
            # Both begin from the same draw of the seed: only float32's own unit; where the weights are kept in
            # bf16 beside float32 masters, a wrapper may take its masters before the cast or after it (DeepSpeed's
            # ZeRO-0 with AdamW takes them before, ZeRO-1 to 3 after): one bf16 rounding.
            unit = UNIT_ROUNDOFF["bf16"] if self.regime == "bf16-weights" else UNIT_ROUNDOFF["fp32"]
            return KAPPA[quantity] * unit
        bound = KAPPA[quantity] * (step + 1) * (self.compute_unit + self.reduction_unit)
        if quantity in STORED and math.isfinite(stored_ratio):
            bound += (step + 1) * UNIT_ROUNDOFF[stored] * stored_ratio
        if quantity in OUTPUTS:
            if math.isfinite(stored_ratio):
                bound += (step + 1) * UNIT_ROUNDOFF["fp32"] * stored_ratio
            if stored != "fp32":
                bound += KAPPA[quantity] * UNIT_ROUNDOFF[stored]
        if self.adaptive:
            # An element stepped differently at a step moves the next step's gradients (and loss) with it.
            if quantity in STEPPED:
                bound += self.adaptive_term(step)
            elif step > 0:
                bound += self.adaptive_term(step - 1)
        return bound

    def adaptive_term(self, step: int) -> float:
        """``2 √ε_g``: how differently an adaptive optimizer may step the elements whose gradients lie within
        rounding of zero, against the whole update (see the module's docstring)."""
        rounding = KAPPA["gradient"] * self.compute_unit + self.reduction_unit
        return 2 * math.sqrt((step + 1) * rounding)

    def describe(self) -> str:
        adaptive = " + 2·√((step+1)·(κ_g·u_compute + u_reduction)) for an adaptive optimizer" if self.adaptive else ""
        return (
            f"τ = κ·(step+1)·({self.compute_unit:.3g} + 2^-24·√({self.tokens}·{self.width}) = "
            f"{self.reduction_unit:.3g}) + (step+1)·u_stored·‖value‖/‖change‖{adaptive}; κ: "
            + ", ".join(f"{q} {k:g}" for q, k in KAPPA.items())
        )


def relative(difference: float, scale: float) -> float:
    """``difference / scale``, where a zero scale with a zero difference is agreement (0) and a zero scale
    with any difference is all of it (inf)."""
    if scale > 0:
        return difference / scale
    return 0.0 if difference == 0 else math.inf
