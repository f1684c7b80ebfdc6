"""One item, observed: launch it in its cell's environment, classify what the ranks recorded,
compare with the expectation, and return its record. The one way an item is run, by ``run``,
``bisect``, ``grid`` and the pytest plugin alike."""

from __future__ import annotations

import datetime as dt
import shlex
from collections.abc import Sequence

from harness.environments import Environments, Resolved
from harness.environments.integrity import describe
from harness.expectations import expectation_for
from harness.launchers import Launcher, LaunchRequest
from harness.matrix import Cell
from harness.outcome import Observation, classify, classify_scenario
from harness.planning import PlannedItem
from harness.records import ItemId, ItemRecord, item_device, item_record, unobserved_record
from harness.repro_registry import BrokenRepro, Repro
from harness.run_dir import RunDir
from repros.common.outcomes import Outcome
from repros.common.spec import ReproSpec


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
    environments: Environments | None = None,
    known: Sequence[ReproSpec] = (),
) -> ItemRecord:
    """Launch one item and return its record (UNRESOLVABLE where the cell has no environment).

    With ``environments``, the cell's environment is checked before the item (a damaged one is
    rebuilt first) and after it: an item during which it changed (a repro that edits
    site-packages) is INFRA, naming what changed, never a classified outcome."""
    if environments is None or resolved.env is None:
        return _observe(run_id, item, repro, resolved, run_dir, launcher, repro_cmd, gpus, None, known)
    with environments.ready_for_item(item.cell) as ready:
        return _observe(run_id, item, repro, ready, run_dir, launcher, repro_cmd, gpus, environments, known)


def _observe(
    run_id: str,
    item: PlannedItem,
    repro: Repro,
    resolved: Resolved,
    run_dir: RunDir,
    launcher: Launcher,
    repro_cmd: str,
    gpus: Sequence[str],
    environments: Environments | None,
    known: Sequence[ReproSpec],
) -> ItemRecord:
    started = now()
    env = resolved.env
    if env is None:
        unresolvable = unobserved_record(
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
        return _item_fields(unresolvable, item)
    item_dir = run_dir.item_dir(item.id)
    request = LaunchRequest(
        env=env,
        module=item.module,
        mode=item.rank_mode or item.mode,
        world_size=item.world_size,
        item_dir=item_dir,
        timeout_s=item.cell.timeout_s,
        cell=item.cell.name,
        extra_env={"CUDA_VISIBLE_DEVICES": ",".join(gpus)} if gpus else {},
        params={**repro.rank_params, **item.launch_params()},
    )
    launch = launcher.launch(request)
    if item.runs_as_written:
        own = None if "scenario" in item.params else repro.spec
        observation = classify_scenario(own, launch, known)
    else:
        observation = classify(item.mode, repro.spec, launch)
    damaged = environments.damage(env) if environments is not None else []
    if damaged:
        reason = f"the cell's environment changed while the item ran: {describe(damaged)}"
        observation = Observation(Outcome.INFRA, error=observation.error, reasons=(reason,))
        environments.invalidate(env, reason)  # type: ignore[union-attr]
        launcher.cell_done(env)  # its pre-imported worker holds modules of the old files
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
    _item_fields(record, item)
    if launch.fallback_reason:
        record["launcher_fallback"] = launch.fallback_reason
    if gpus:
        record["gpus_leased"] = list(gpus)
    if env.repaired:
        record["environment_repaired"] = env.repaired
    record["model"] = item.cell.model
    if "variant" in item.params:
        record["variant"] = str(item.params["variant"])
    if "scenario" in item.params:
        record["scenario"] = dict(item.params["scenario"])  # type: ignore[call-overload]
    return record


def _item_fields(record: ItemRecord, item: PlannedItem) -> ItemRecord:
    """What the plan says about the item: explored, and the matrix cell a pinned cell came from."""
    if item.explore:
        record["explored"] = True
    if item.cell.origin:
        record["cell_origin"] = item.cell.origin
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
