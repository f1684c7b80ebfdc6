"""FAULT-SIGKILL: rank 1 kills itself with SIGKILL in the middle of a collective step."""

from __future__ import annotations

from repros.runtime.spec import Expectation, ReproSpec

SPEC = ReproSpec(
    id="FAULT-SIGKILL",
    title="a rank dies by SIGKILL mid-step",
    upstream=(),
    signatures=(),
    expectations=(Expectation("bug", "CRASH"),),
    modes=("bug",),
)


def run(ctx) -> None:  # type: ignore[no-untyped-def]
    import os
    import signal

    import torch
    import torch.distributed as dist

    value = torch.ones(4)
    for step in range(ctx.steps):
        if step == 1 and ctx.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        dist.all_reduce(value)
