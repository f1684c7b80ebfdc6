"""FAULT-HANG: rank 0 raises and then never exits (a stuck teardown); rank 1 waits
for it in a collective forever."""

from __future__ import annotations

from repros.runtime.spec import Expectation, ReproSpec

SPEC = ReproSpec(
    id="FAULT-HANG",
    title="a rank hangs in a collective while its peer raised",
    upstream=(),
    signatures=(),
    expectations=(Expectation("bug", "HANG"),),
    modes=("bug",),
)


def run(ctx) -> None:  # type: ignore[no-untyped-def]
    import subprocess
    import sys
    import time

    import torch
    import torch.distributed as dist

    # A child process as a data loader worker would be: it must not outlive the item.
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(900)", "fault-hang-worker"])
    if ctx.rank == 0:
        try:
            raise ValueError("rank 0 gives up")
        except ValueError:
            time.sleep(900)
    dist.all_reduce(torch.ones(4))
