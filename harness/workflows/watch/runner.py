"""``watch``: tonight's run of the lane, compared with the previous night's, every change explained.

1. Run the selection as ``run`` does (floating cells resolve tonight, or ``--as-of`` a day).
2. Pair its items with the previous night's; keep those whose outcome changed. Items that cannot be
   paired are named with why (a torn record, an item that night did not plan or did not record);
   a previous night that pairs with nothing is a usage error (exit 2), never "nothing changed".
3. Classify each (``classify.py``): rerun where nothing moved, bisect what moved.
4. Write ``changes.json`` and ``changes.md`` into the run directory (and append the markdown to
   ``$GITHUB_STEP_SUMMARY``), then the run's reports again, so ``index.html`` and ``junit.xml`` carry
   the changes.

Exit 1 only when something regressed; 2 for a usage error; 130 when interrupted.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from harness.core.errors import EXIT_USAGE, UserError
from harness.core.invocation import program
from harness.pipeline.session import EXIT_INTERRUPTED, RunSession
from harness.planning.items import RunOptions, plan_items
from harness.records.changes import CHANGES_MARKDOWN, FIXED_UPSTREAM, REGRESSED, VERDICTS, Change, write_changes
from harness.records.run_dir import RunDir
from harness.reports.changes_summary import culprit_text, headline, markdown, moved_text
from harness.reports.finalize import finalize
from harness.workflows.watch.classify import DEFAULT_CONFIRM, WatchContext, classify
from harness.workflows.watch.nights import Night, Pairing, changed_items, pairing

#: Where each change's reruns and bisects keep their run directories, inside the watch run's.
WORK_DIR = "watch"
#: The items not compared that are named on the terminal (``run.json`` keeps every one).
UNPAIRED_SHOWN = 10


@dataclass(frozen=True)
class WatchOptions:
    run: RunOptions
    previous: Path
    confirm: int = DEFAULT_CONFIRM
    #: Also write the markdown summary here.
    markdown: Path | None = None
    #: Write a fixed-upstream item's new expectation: True do it, False never, None ask on a terminal.
    update_expectations: bool | None = None


def update_command(opts: WatchOptions, change: Change, tonight: Night) -> str:
    """The one command that runs the item again and writes what it observes as its expectation."""
    args = [*program(), "run", "--matrix", str(opts.run.matrix.path), "--cells", change.previous_cell or change.cell]
    args += ["--repros", change.repro, "--modes", change.mode]
    args += opts.run.stack.evolve(families=(), as_of=tonight.meta.as_of).flags()
    return shlex.join([*args, "--save-expectations"])


def execute_watch(opts: WatchOptions, console: Console, argv: Sequence[str]) -> int:
    previous = Night.load(opts.previous)
    if opts.run.out_dir is not None and opts.run.out_dir.resolve() == previous.path.resolve():
        raise UserError("--out", str(opts.run.out_dir), "is the previous night's directory", "give tonight its own")
    plan = plan_items(opts.run)
    session = RunSession(opts.run, console, argv, None, plan=plan, kind="watch")
    status = session.execute()
    if status in (EXIT_USAGE, EXIT_INTERRUPTED) or session.path is None:
        return status
    tonight = Night.load(session.path, flag="--out")
    paired = pairing(previous, tonight)
    for line in paired.unpaired[:UNPAIRED_SHOWN]:
        console.print(f"watch: not compared: {line}", highlight=False, markup=False)
    if len(paired.unpaired) > UNPAIRED_SHOWN:
        console.print(f"watch: ... and {len(paired.unpaired) - UNPAIRED_SHOWN} more not compared", highlight=False)
    if paired.compared == 0:
        _record_pairing(session.path, previous, paired)
        raise UserError(
            "--previous",
            str(previous.path),
            f"pairs with none of tonight's {len(tonight.records)} items: nothing was compared",
            "pass the previous night of the same matrix and lane (tonight's run is kept in " + str(session.path) + ")",
        )
    candidates = changed_items(previous, tonight)
    console.print(
        f"watch: {len(candidates)} of the {paired.compared} items compared changed their outcome since "
        f"{previous.path}" + (f" ({len(paired.unpaired)} not compared)" if paired.unpaired else ""),
        highlight=False,
        markup=False,
    )
    context = WatchContext(
        run=opts.run,
        previous=previous,
        tonight=tonight,
        planned={(i.cell.name, i.repro_id, i.mode): i for i in plan.items},
        work_dir=session.path / WORK_DIR,
        console=console,
        confirm=opts.confirm,
    )
    changes: list[Change] = []
    interrupted = False
    try:
        for candidate in candidates:
            change = classify(context, candidate)
            if change.verdict == FIXED_UPSTREAM:
                change = change.model_copy(update={"update_command": update_command(opts, change, tonight)})
            changes.append(change)
            write_changes(session.path, changes)  # whole after each: an interrupted watch keeps what it found
    except KeyboardInterrupt:
        interrupted = True
    publish(opts, changes, previous, session.path, console, paired)
    if interrupted:
        console.print(f"interrupted: {len(candidates) - len(changes)} changes not classified", highlight=False)
        return EXIT_INTERRUPTED
    offer_updates(opts, changes, console)
    return 1 if any(c.verdict == REGRESSED for c in changes) else 0


def _record_pairing(path: Path, previous: Night, paired: Pairing, **more: object) -> None:
    """``run.json``'s ``watch``: the previous night, how many items were compared, which were not and why."""
    run_dir = RunDir(path)
    watched = {"previous": str(previous.path), "compared": paired.compared, "not_compared": paired.unpaired, **more}
    run_dir.write_meta(run_dir.read_meta().evolve(watch=watched))


def publish(
    opts: WatchOptions, changes: list[Change], previous: Night, path: Path, console: Console, paired: Pairing
) -> None:
    write_changes(path, changes)
    run_dir = RunDir(path)
    counts = {v: sum(1 for c in changes if c.verdict == v) for v in VERDICTS}
    _record_pairing(path, previous, paired, changes=len(changes), verdicts=counts)
    text = markdown(changes, str(previous.path), str(path), paired.unpaired)
    (path / CHANGES_MARKDOWN).write_text(text, encoding="utf-8")
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    for target in [t for t in (opts.markdown, Path(summary) if summary else None) if t is not None]:
        with target.open("a", encoding="utf-8") as out:
            out.write(text + "\n")
    done = finalize(run_dir)
    for failed in done.failed:
        console.print(f"could not write {failed}", highlight=False)
    console.print(headline(changes, len(paired.unpaired)), highlight=False, markup=False)
    for c in changes:
        culprit = f"; culprit {culprit_text(c)}" if c.culprit else ""
        console.print(
            f"  {c.verdict}: {c.item} {c.before} -> {c.after} (moved: {moved_text(c)}){culprit}",
            highlight=False,
            markup=False,
        )
        console.print(f"    {c.reason}", highlight=False, markup=False)
        if c.update_command:
            console.print(f"    update its expectation: {c.update_command}", highlight=False, markup=False)
    console.print(f"changes: {path / 'changes.json'}", highlight=False)


def offer_updates(opts: WatchOptions, changes: list[Change], console: Console) -> None:
    """Run each fixed-upstream item's update command, where asked to (or on a terminal, where the
    user says yes)."""
    import subprocess

    for change in changes:
        if not change.update_command or opts.update_expectations is False:
            continue
        if opts.update_expectations is None:
            if not (sys.stdin.isatty() and sys.stdout.isatty()):
                continue
            answer = input(f"{change.item} no longer reproduces: write its new expectation now? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                continue
        console.print(f"running: {change.update_command}", highlight=False)
        subprocess.run(shlex.split(change.update_command), check=False)
