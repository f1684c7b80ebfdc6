"""A ``crosscheck`` item on the ranks: one strategy held against the one-process reference.

Not a documented failure of its own (it is not in the catalog, so discovery never finds it): the orchestrator
launches it for each (cell, strategy) of ``ft-regress crosscheck`` with ``ctx.params``: ``strategy`` (its name),
``seed`` and ``attempt`` (a repeated item trains from ``seed + attempt``), ``steps`` and, to prove the comparison,
``break`` (a deliberate fault, ``training.Breakage``).
"""

from __future__ import annotations

from repros.runtime.context import RankContext
from repros.runtime.spec import ReproSpec

SPEC = ReproSpec(
    id="crosscheck",
    title="a training strategy held against one process training the same adapter",
    upstream=(),
    signatures=(),
    expectations=(),
)


def run(ctx: RankContext) -> None:
    from repros.trainer.crosscheck.check import DEFAULT_STEPS, crosscheck
    from repros.trainer.crosscheck.strategy import parse
    from repros.trainer.crosscheck.training import Breakage

    params = ctx.params
    seed = int(params.get("seed") or 0) + int(params.get("attempt") or 0)
    steps = int(params.get("steps") or DEFAULT_STEPS)
    crosscheck(ctx, parse(str(params["strategy"])), seed, steps, Breakage(params.get("break")))
