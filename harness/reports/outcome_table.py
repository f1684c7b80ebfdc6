"""How each outcome is shown, in one table: every display reads it (the terminal's tables, the HTML
report's colours and legend, JUnit's failures, the findings of an explored run).

An outcome is declared twice, no more: its member of ``Outcome`` (``repros/runtime/outcomes.py``,
what a record may hold) and its row here. The HTML report's ``.o-<OUTCOME>`` rules are made from
these rows (``css``), not written by hand; a test holds the two files equal.
"""

from __future__ import annotations

from dataclasses import dataclass

from repros.runtime.outcomes import Outcome


@dataclass(frozen=True)
class Colour:
    """An outcome's colour: a rich style in the terminal; a background (and any more CSS) in the HTML report."""

    terminal: str
    background: str
    #: More CSS declarations for its cells (``font-weight: 600``).
    more: str = ""

    def declarations(self) -> str:
        return f"background: {self.background};" + (f" {self.more};" if self.more else "")


@dataclass(frozen=True)
class Shown:
    """How one outcome is shown."""

    outcome: Outcome
    #: What it says of the code under test, as a finding reads (``runs in cell-a``, ``fails as declared in ...``).
    verdict: str
    colour: Colour
    #: What it means, in one line: the HTML legend's, JUnit's failure's, ``--help``'s.
    legend: str
    #: Its colour where a documented failure expects it there (a DIVERGES a documented failure explains);
    #: None: as ``colour``.
    documented: Colour | None = None
    #: How a table names it (its name unless said).
    label: str = ""

    @property
    def name(self) -> str:
        return self.label or str(self.outcome)


#: Every outcome, in the order a legend lists them.
TABLE: tuple[Shown, ...] = (
    Shown(
        Outcome.REPRODUCED,
        "fails as declared",
        Colour("yellow", "#fff1c2"),
        "a rank's error matches a documented signature (a scenario's: any repro's)",
    ),
    Shown(
        Outcome.NOT_REPRODUCED,
        "runs",
        Colour("cyan", "#ddf4ff"),
        "bug mode ran to its end without the documented failure",
    ),
    Shown(
        Outcome.DIFFERENT_ERROR,
        "fails differently",
        Colour("magenta", "#fbe2f4"),
        "bug mode raised an error none of the repro's signatures names",
    ),
    Shown(
        Outcome.PASS,
        "runs",
        Colour("green", "#dafbe1"),
        "it trained: the loss fell, every adapter got a gradient and moved (or it ran to its end, by its pass rule)",
    ),
    Shown(
        Outcome.FAIL,
        "fails",
        Colour("red", "#ffd8d3"),
        "fixed mode raised, or did not train",
    ),
    Shown(
        Outcome.AGREES,
        "agrees with one process",
        Colour("green", "#dafbe1"),
        "the strategy trained what one process trains on the same batch, within tolerance",
    ),
    Shown(
        Outcome.DIVERGES,
        "diverges from one process",
        Colour("bold red", "#ffd8d3", "font-weight: 600"),
        "the strategy trained otherwise than one process, or raised (yellow where a documented failure explains it)",
        documented=Colour("yellow", "#fff1c2", "font-weight: 400"),
    ),
    Shown(
        Outcome.SILENT_FAILURE,
        "fails silently",
        Colour("magenta", "#f3c4f0"),
        "it ran, but did not train, or what it saved does not load back the same",
    ),
    Shown(
        Outcome.NEW_FAILURE,
        "fails in a new way",
        Colour("bold red", "#ff9f94", "font-weight: 600"),
        "it raised an error no documented failure names: what a nightly exists to find",
    ),
    Shown(
        Outcome.FLAKY,
        "ends differently from one attempt to the next",
        Colour("yellow", "#f3d9fa"),
        "its attempts (--repeat) did not all end the same way",
    ),
    Shown(
        Outcome.INFRA,
        "could not run",
        Colour("dim", "#e4e2f7"),
        "the machine, the cell's stack or the launch failed: nothing was learnt of the code under test",
    ),
    Shown(
        Outcome.HANG,
        "could not run",
        Colour("red", "#ffd7a8"),
        "no end within the item's timeout",
    ),
    Shown(
        Outcome.CRASH,
        "crashes",
        Colour("red", "#f5b5ae"),
        "a rank was killed, or ended without its final record",
    ),
    Shown(
        Outcome.UNRESOLVABLE,
        "could not run",
        Colour("dim", "#e6e6e6"),
        "the cell's environment could not be resolved or installed: nothing was launched",
    ),
)

_BY_OUTCOME: dict[str, Shown] = {str(row.outcome): row for row in TABLE}


def shown(outcome: str) -> Shown:
    """How ``outcome`` is shown (``KeyError`` for a name that is not an outcome)."""
    return _BY_OUTCOME[str(Outcome(outcome))]


def terminal_style(outcome: str, documented: bool = False) -> str:
    """Its terminal style (rich); ``documented``: where a documented failure expects it there."""
    row = _BY_OUTCOME.get(str(outcome))
    if row is None:
        return ""
    colour = row.documented if documented and row.documented is not None else row.colour
    return colour.terminal


def css() -> str:
    """The HTML report's rules for every outcome's cells: ``.o-<OUTCOME>``, and ``.o-<OUTCOME>.documented``."""
    rules = []
    for row in TABLE:
        rules.append(f".o-{row.outcome} {{ {row.colour.declarations()} }}")
        if row.documented is not None:
            rules.append(f".o-{row.outcome}.documented {{ {row.documented.declarations()} }}")
    return "\n".join(rules) + "\n"
