"""An attempt lost with its node is run again: every command runs items through this, whatever
the executor. Each loss is kept on the record that finally comes as an INFRA attempt naming the
node, and a reason line says so; an item lost every time (or that no node could ever take) is INFRA,
never a classified outcome."""

from __future__ import annotations

from collections.abc import Sequence

from harness.environments import Resolved
from harness.pipeline.executors.base import Attempted, Executor, ItemJob, ItemLost
from harness.pipeline.item_records import unobserved_record
from harness.pipeline.observe import now
from harness.records.item import Attempt, ItemRecord
from repros.runtime.outcomes import Outcome

#: An item whose node was lost under it runs again up to this many times; then its record is INFRA.
LOST_RETRIES = 2


def attempt_until_not_lost(
    executor: Executor, job: ItemJob, resolved: Resolved | None, gpus: Sequence[str]
) -> Attempted:
    lost: list[ItemLost] = []
    while True:
        try:
            attempted = executor.attempt(job, resolved, gpus)
        except ItemLost as exc:
            lost.append(exc)
            if exc.retry and len(lost) <= LOST_RETRIES:
                continue
            return Attempted(lost_record(job, lost), node=exc.node)
        if not lost:
            return attempted
        return Attempted(after_lost(attempted.record, lost), attempted.cell_meta, attempted.node)


def lost_record(job: ItemJob, lost: list[ItemLost]) -> ItemRecord:
    """Every attempt was lost with its node: the item is INFRA, each loss named."""
    last = lost[-1]
    said = "; ".join(f"attempt {i}: node {e.node}: {e.reason}" for i, e in enumerate(lost, 1))
    record = unobserved_record(
        outcome=Outcome.INFRA,
        error_type=last.error_type,
        run_id=job.run_id,
        item=job.item.id,
        reason=f"the item's node was lost before it finished ({said})",
        world_size=job.item.world_size,
        repro_cmd=job.repro_cmd,
        started_at=now(),
        finished_at=now(),
        node=last.node,
    )
    return record.evolve(attempts=[lost_attempt(e) for e in lost[:-1]]) if len(lost) > 1 else record


def lost_attempt(lost: ItemLost) -> Attempt:
    return Attempt(outcome=Outcome.INFRA, error_type=lost.error_type, message=f"node {lost.node}: {lost.reason}")


def after_lost(record: ItemRecord, lost: list[ItemLost]) -> ItemRecord:
    """The record of the attempt that ran, after attempts lost with their nodes (kept as INFRA)."""
    nodes = ", ".join(e.node for e in lost)
    said = f"run again after its node was lost: attempt{'s' if len(lost) > 1 else ''} lost on {nodes} (INFRA)"
    if record.node:
        said += f"; this attempt ran on {record.node}"
    return record.evolve(attempts=[*(lost_attempt(e) for e in lost), *record.attempts], reasons=[*record.reasons, said])
