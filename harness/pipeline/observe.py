"""One attempt of an item, observed on this machine: launch it in its cell's environment, classify
what the ranks recorded, compare with the expectation, and return its record.

``observe_item`` has one caller, the local executor's ``attempt`` (``executors/local.py``), which a
cluster's node runs too (``executors/node.py``). Every command reaches it the same way, through the
item runner (``item_runner.py``) and the run's executor: ``run``, ``grid``, ``costs``, ``check``,
``bisect``'s steps, ``watch``'s reruns and the pytest plugin."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from harness.config.expectations import crosscheck_expectation, expectation_for
from harness.config.matrix import Cell
from harness.config.repros import BrokenRepro
from harness.core.json import JsonObject
from harness.environments import Environment, Environments, Resolved
from harness.environments.integrity import describe
from harness.execution.classify import Observation, classify, naming_a_divergence
from harness.execution.launchers import Launcher, LaunchRequest
from harness.execution.launchers.result import LaunchResult
from harness.pipeline.executors.base import ItemJob
from harness.pipeline.item_records import item_device, item_record, unobserved_record, versions_seen
from harness.planning.items import PlannedItem
from harness.records.item import FIXED_TRAINER, OWN_WORKAROUND, ItemId, ItemRecord
from harness.records.run_dir import RunDir
from harness.records.run_meta import utc_now
from repros.runtime.spec import Expectation
from repros.trainer.crosscheck.strategy import parse as parse_strategy


def observe_item(
    job: ItemJob,
    resolved: Resolved,
    run_dir: RunDir,
    launcher: Launcher,
    gpus: Sequence[str] = (),
    environments: Environments | None = None,
) -> ItemRecord:
    """Launch one attempt of ``job`` into ``run_dir`` and return its record (UNRESOLVABLE where the
    cell has no environment).

    With ``environments``, the cell's environment is checked before the item (a damaged one is
    rebuilt first) and after it: an item during which it changed (a repro that edits
    site-packages) is INFRA, naming what changed, never a classified outcome."""
    if resolved.env is None:
        return unresolvable_record(job, resolved.reason)
    if environments is None:
        return _observe(job, resolved.env, run_dir, launcher, gpus, None)
    with environments.ready_for_item(job.item.cell) as ready:
        if ready.env is None:
            return unresolvable_record(job, ready.reason)
        return _observe(job, ready.env, run_dir, launcher, gpus, environments)


def unresolvable_record(job: ItemJob, reason: str) -> ItemRecord:
    """The item's cell has no environment (``reason``): UNRESOLVABLE, nothing launched."""
    stamp = utc_now()
    return unobserved_record(
        observation=classify(job.item.judged_as, None, no_environment=reason),
        error_type="EnvironmentUnavailable",
        run_id=job.run_id,
        item=job.item.id,
        world_size=job.item.world_size,
        repro_cmd=job.repro_cmd,
        started_at=stamp,
        finished_at=stamp,
        **plan_fields(job.item),
    )


def _observe(
    job: ItemJob,
    env: Environment,
    run_dir: RunDir,
    launcher: Launcher,
    gpus: Sequence[str],
    environments: Environments | None,
) -> ItemRecord:
    started = utc_now()
    item, repro = job.item, job.repro
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
        params={**repro.rank_params, **item.launch_params(), **({"attempt": job.attempt} if job.attempt else {})},
        scan_root=run_dir.path,
    )
    try:
        launch = launcher.launch(request)
    except OSError as exc:
        # The interpreter or a file the launch needs is gone (another run's cache eviction, a
        # hand-deleted environment): the environment's trouble, never the run's end.
        damage = _retire_if_damaged(environments, launcher, env, "before the item could start")
        not_started = damage or f"the item could not be started: {type(exc).__name__}: {exc}"
        return unobserved_record(
            observation=classify(item.judged_as, None, not_started=not_started),
            error_type=type(exc).__name__,
            run_id=job.run_id,
            item=item.id,
            world_size=item.world_size,
            repro_cmd=job.repro_cmd,
            started_at=started,
            finished_at=utc_now(),
            **plan_fields(item),
        )
    damage = _retire_if_damaged(environments, launcher, env, "while the item ran")
    # Expectations are looked up by what the ranks imported (the listing's other packages beside).
    versions = {**env.packages, **versions_seen(env, launch)[0]}
    device = item_device(launch) or ("cuda" if gpus else "cpu")
    expected_divergence = (
        crosscheck_expectation(item.strategy, job.known, versions, device, launch.world_size)
        if item.strategy is not None
        else None
    )
    # A grid combination and a crosscheck strategy have no repro of their own to hold an error against; a
    # strategy's difference is named only by the failure expected to cause it here (else it is a finding).
    own = None if item.scenario is not None or item.strategy is not None else repro.spec
    known = naming_a_divergence(expected_divergence.spec, job.known) if expected_divergence is not None else job.known
    observation = classify(item.judged_as, own, launch, known, damage=damage)
    launched: JsonObject = {"model": item.cell.model}
    if item.mode == "fixed" and not item.runs_as_written:
        launched["workaround"] = OWN_WORKAROUND if repro.spec.pass_rule == "clean-exit" else FIXED_TRAINER
    if launch.fallback_reason:
        launched["launcher_fallback"] = launch.fallback_reason
    if gpus:
        launched["gpus_leased"] = list(gpus)
    if env.repaired:
        launched["environment_repaired"] = env.repaired
    expectation: Expectation | None
    if expected_divergence is not None:
        launched.update(crosscheck_fields(observation, launch))
        expectation = expected_divergence.expectation
        # DIVERGES matches only by the failure expected to make it (a divergence nobody documented is a finding).
        named = expected_divergence.names(observation.signature)
        launched["matched"] = observation.outcome == expectation.outcome and named
    else:
        expectation = expectation_for(repro.spec, item.mode, versions, device, launch.world_size)
    return item_record(
        run_id=job.run_id,
        item=item.id,
        observation=observation,
        expected=expectation,
        env=env,
        launch=launch,
        repro_cmd=job.repro_cmd,
        item_dir=item_dir,
        started_at=started,
        finished_at=utc_now(),
        **plan_fields(item),
        **launched,
    )


def _retire_if_damaged(
    environments: Environments | None, launcher: Launcher, env: Environment, when: str
) -> str | None:
    """Why ``env`` cannot be trusted ``when`` (what changed in it), or None where it is whole. A damaged
    environment is marked for a rebuild and its cell's pre-imported worker, which holds modules of the
    old files, is retired."""
    damaged = environments.damage(env) if environments is not None else []
    if not damaged or environments is None:
        return None
    reason = f"the cell's environment changed {when}: {describe(damaged)}"
    environments.invalidate(env, reason)
    launcher.cell_done(env)
    return reason


def plan_fields(item: PlannedItem) -> JsonObject:
    """What the plan says about the item: explored, the matrix cell a pinned cell came from, and
    the variant or grid combination it runs."""
    fields: JsonObject = {"family": item.cell.family}
    if item.cell.family_of is not None:
        fields["family_of"] = item.cell.family_of
    if item.explore:
        fields["explored"] = True
    if item.cell.origin:
        fields["cell_origin"] = item.cell.origin
    if item.variant is not None:
        fields["variant"] = item.variant
    if item.scenario is not None:
        fields["scenario"] = dict(item.scenario)
    if item.strategy is not None:
        fields["kind"] = "crosscheck"
        fields["strategy"] = item.strategy
        fields["strategy_parts"] = dict(parse_strategy(item.strategy).parts())
    return fields


def crosscheck_fields(observation: Observation, launch: LaunchResult) -> JsonObject:
    """What a crosscheck record carries beside the outcome: the divergence (from the classification) and the
    comparison as rank 0 recorded it (the reference, the tolerance, both trajectories, the closest call)."""
    rank0 = launch.records.get(0)
    facts = dict(rank0.crosscheck or {}) if rank0 is not None else {}
    for key in ("divergence", "strategy", "strategy_parts"):
        facts.pop(key, None)
    return {"divergence": dict(observation.divergence) if observation.divergence else None, "crosscheck": facts or None}


def broken_record(run_id: str, cell: Cell, broken: BrokenRepro) -> ItemRecord:
    """A repro file that cannot be loaded: INFRA in each cell it would have run in."""
    stamp = utc_now()
    return unobserved_record(
        observation=classify("bug", None, not_started=f"{broken.module}: {broken.reason}"),
        error_type="ReproUnloadable",
        run_id=run_id,
        item=ItemId(cell.name, broken.id, "bug"),
        world_size=cell.world_size,
        repro_cmd=shlex.join(["python", "-c", f"import runpy; runpy.run_path({broken.module!r})"]),
        started_at=stamp,
        finished_at=stamp,
    )
