"""One item, observed: launch it in its cell's environment, classify what the ranks recorded,
compare with the expectation, and return its record. The one way an item is run, by ``run``,
``bisect``, ``grid`` and the pytest plugin alike."""

from __future__ import annotations

import datetime as dt
import shlex
from collections.abc import Sequence

from harness.environments import Resolved
from harness.expectations import expectation_for
from harness.launchers import Launcher, LaunchRequest
from harness.matrix import Cell
from harness.outcome import classify
from harness.planning import PlannedItem
from harness.records import ItemId, ItemRecord, item_device, item_record, unobserved_record
from harness.repro_registry import BrokenRepro, Repro
from harness.run_dir import RunDir
from repros.common.outcomes import Outcome


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def observe_item(
    *,
    run_id: str,
    item: PlannedItem,
    repro: Repro,
    resolved: Resolved,
    run_dir: RunDir,
    launcher: Launcher,
    repro_cmd: str,
    gpus: Sequence[str] = (),
) -> ItemRecord:
    """Launch one item and return its record (UNRESOLVABLE where the cell has no environment)."""
    started = now()
    env = resolved.env
    if env is None:
        return unobserved_record(
            outcome=Outcome.UNRESOLVABLE,
            error_type="EnvironmentUnavailable",
            run_id=run_id,
            item=item.id,
            reason=resolved.reason,
            world_size=item.world_size,
            repro_cmd=repro_cmd,
            started_at=started,
            finished_at=now(),
        )
    item_dir = run_dir.item_dir(item.id)
    request = LaunchRequest(
        env=env,
        module=item.module,
        mode=item.mode,
        world_size=item.world_size,
        item_dir=item_dir,
        timeout_s=item.cell.timeout_s,
        cell=item.cell.name,
        extra_env={"CUDA_VISIBLE_DEVICES": ",".join(gpus)} if gpus else {},
    )
    launch = launcher.launch(request)
    observation = classify(item.mode, repro.spec, launch)
    versions = {**env.packages, "python": env.python_version}
    device = item_device(launch) or ("cuda" if gpus else "cpu")
    record = item_record(
        run_id=run_id,
        item=item.id,
        observation=observation,
        expected=expectation_for(repro.spec, item.mode, versions, device),
        env=env,
        launch=launch,
        repro_cmd=repro_cmd,
        item_dir=item_dir,
        started_at=started,
        finished_at=now(),
    )
    if launch.fallback_reason:
        record["launcher_fallback"] = launch.fallback_reason
    if gpus:
        record["gpus_leased"] = list(gpus)
    return record


def broken_record(run_id: str, cell: Cell, broken: BrokenRepro) -> ItemRecord:
    """A repro file that cannot be loaded: INFRA in each cell it would have run in."""
    stamp = now()
    return unobserved_record(
        outcome=Outcome.INFRA,
        error_type="ReproUnloadable",
        run_id=run_id,
        item=ItemId(cell.name, broken.id, "bug"),
        reason=f"{broken.module}: {broken.reason}",
        world_size=cell.world_size,
        repro_cmd=shlex.join(["python", "-c", f"import runpy; runpy.run_path({broken.module!r})"]),
        started_at=stamp,
        finished_at=stamp,
    )
