"""FAULT-MARKUP: an exception whose message carries HTML, script and terminal markup."""

from __future__ import annotations

from repros.runtime.spec import Expectation, ReproSpec

MESSAGE = "<script>alert('x')</script> [bold red]not markup[/bold red] & <b>bold</b>"

SPEC = ReproSpec(
    id="FAULT-MARKUP",
    title="an exception message with markup in it",
    upstream=(),
    signatures=(),
    expectations=(Expectation("bug", "DIFFERENT_ERROR"),),
    modes=("bug",),
)


def run(ctx) -> None:  # type: ignore[no-untyped-def]
    raise RuntimeError(MESSAGE)
