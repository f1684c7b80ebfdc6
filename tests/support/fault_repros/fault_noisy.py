"""FAULT-NOISY: a rank prints megabytes to stderr, then finishes cleanly."""

from __future__ import annotations

from repros.runtime.spec import Expectation, ReproSpec

MEGABYTES = 3

SPEC = ReproSpec(
    id="FAULT-NOISY",
    title="a rank floods stderr",
    upstream=(),
    signatures=(),
    expectations=(Expectation("bug", "NOT_REPRODUCED"),),
    modes=("bug",),
)


def run(ctx) -> None:  # type: ignore[no-untyped-def]
    import sys

    line = "noise " * 15 + "\n"
    for _ in range(MEGABYTES * 2**20 // len(line)):
        sys.stderr.write(line)
    sys.stderr.write("the last line of the noise\n")
