"""FAULT-DAMAGE: a repro that edits its own cell's site-packages (peft's __init__.py) while it runs."""

from __future__ import annotations

from repros.runtime.spec import Expectation, ReproSpec

MARKER = "# edited by FAULT-DAMAGE"

SPEC = ReproSpec(
    id="FAULT-DAMAGE",
    title="a repro that edits site-packages",
    upstream=(),
    signatures=(),
    # Whatever it would have observed, the harness must call it INFRA: the cell changed under it.
    expectations=(Expectation("bug", "INFRA"),),
    modes=("bug",),
)


def run(ctx) -> None:  # type: ignore[no-untyped-def]
    import importlib.util

    if ctx.rank == 0:
        origin = importlib.util.find_spec("peft").origin
        with open(origin, "a") as fh:
            fh.write(f"\n{MARKER}\n")
