"""The changes a ``watch`` run found, as markdown: ``changes.md`` in the run directory, appended to
``$GITHUB_STEP_SUMMARY`` where a GitHub Actions step runs it."""

from __future__ import annotations

from collections.abc import Sequence

from harness.records.changes import FIXED_UPSTREAM, REGRESSED, VERDICTS, Change


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def moved_text(change: Change) -> str:
    return ", ".join(f"{n} {a or '-'} → {b or '-'}" for n, (a, b) in change.moved.items()) or "nothing"


def culprit_text(change: Change) -> str:
    c = change.culprit
    return f"{c.package} {c.last} → {c.first}" if c else "-"


def headline(changes: Sequence[Change], not_compared: int = 0) -> str:
    """What the night comes to; ``not_compared``: items of either night with no counterpart in the
    other, said beside it (a change among them could not be seen)."""
    aside = f" {not_compared} item{'s' if not_compared != 1 else ''} could not be compared." if not_compared else ""
    if not changes:
        among = " of those compared" if not_compared else ""
        return f"No item{among} changed its outcome.{aside}"
    counts = {v: sum(1 for c in changes if c.verdict == v) for v in VERDICTS}
    parts = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
    regressed = counts[REGRESSED]
    lead = f"**{regressed} regressed**" if regressed else "No regression"
    return f"{lead}: {len(changes)} item{'s' if len(changes) != 1 else ''} changed ({parts}).{aside}"


#: The items not compared that the markdown names (``run.json`` keeps every one).
NOT_COMPARED_SHOWN = 20


def markdown(changes: Sequence[Change], previous: str, tonight: str, not_compared: Sequence[str] = ()) -> str:
    lines = [f"## ft-regress watch: {tonight} against {previous}", "", headline(changes, len(not_compared)), ""]
    if not_compared:
        lines += ["Not compared:", ""]
        lines += [f"- {_cell(line)}" for line in not_compared[:NOT_COMPARED_SHOWN]]
        if len(not_compared) > NOT_COMPARED_SHOWN:
            lines.append(f"- ... and {len(not_compared) - NOT_COMPARED_SHOWN} more (run.json: watch.not_compared)")
        lines.append("")
    if not changes:
        return "\n".join(lines)
    order = {v: i for i, v in enumerate(VERDICTS)}
    lines += [
        "| item | before | after | moved | verdict | culprit (last → first) | why |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in sorted(changes, key=lambda c: (order.get(c.verdict, 99), c.item)):
        before = c.before + (f" ({c.before_signature})" if c.before_signature else "")
        after = c.after + (f" ({c.after_signature})" if c.after_signature else "")
        lines.append(
            f"| {_cell(c.item)} | {_cell(before)} | {_cell(after)} | {_cell(moved_text(c))} | **{c.verdict}** "
            f"| {_cell(culprit_text(c))} | {_cell(c.reason)} |"
        )
    updates = [c for c in changes if c.verdict == FIXED_UPSTREAM and c.update_command]
    if updates:
        lines += ["", "Fixed upstream: record the new observation as the expectation with", ""]
        lines += [f"    {c.update_command}" for c in updates]
    return "\n".join(lines) + "\n"
