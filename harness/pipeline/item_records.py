"""An item's record, built once from what the plan, the environment, the launch and the
classification say (``ItemRecord`` in ``harness/records/item.py`` is what it is)."""

from __future__ import annotations

from pathlib import Path

from harness.core.json import JsonValue
from harness.environments import Environment
from harness.execution.classify import Observation
from harness.execution.launchers.result import LaunchResult
from harness.execution.metrics import summarise
from harness.records.item import SCHEMA_VERSION, EnvSummary, ItemId, ItemRecord, RankSummary, error_summary
from harness.records.rank import RankRecord
from repros.runtime.context import TRACKED_PACKAGES
from repros.runtime.spec import Expectation


def tracked_versions(env: Environment | None) -> dict[str, str | None]:
    """What the cell's listing says of the tracked packages (and Python)."""
    versions: dict[str, str | None] = {"python": env.python_version if env else None}
    for name in TRACKED_PACKAGES:
        versions[name] = env.version(name) if env else None
    return versions


def imported_by_ranks(launch: LaunchResult) -> dict[str, str | None]:
    """What rank 0 (else the lowest rank that says) imported of the tracked packages, and its Python:
    empty where no rank wrote it (none started)."""
    for _, rec in sorted(launch.records.items()):
        if rec is not None and rec.versions_imported:
            seen: dict[str, str | None] = {name: pkg.version for name, pkg in rec.versions_imported.items()}
            if rec.python_version:
                seen["python"] = rec.python_version
            return {k: v for k, v in seen.items() if k == "python" or k in TRACKED_PACKAGES}
    return {}


def versions_seen(env: Environment, launch: LaunchResult) -> tuple[dict[str, str | None], dict[str, str | None] | None]:
    """The item's versions, as its ranks imported them (the listing's where no rank said), and the
    listing itself where it differs (``versions_listed``): a passthrough rank keeps the caller's
    ``PYTHONPATH``, which can put another release first."""
    listed = tracked_versions(env)
    versions = {**listed, **imported_by_ranks(launch)}
    return versions, (listed if versions != listed else None)


def _expectation_fields(expected: Expectation | None, outcome: str) -> dict[str, JsonValue]:
    return {
        "expected": str(expected.outcome) if expected else None,
        "expected_when": dict(expected.when) if expected else None,
        "expected_established_by": expected.established_by if expected else None,
        "expected_device": expected.device if expected else None,
        # An observation with no expectation for its versions is not a match:
        # somebody has to look at it and record what it should be.
        "matched": bool(expected and expected.outcome == outcome),
    }


def env_summary(env: Environment) -> EnvSummary:
    return EnvSummary(
        key=env.key,
        path=env.path,
        python=env.python,
        reused=env.reused,
        build_s=round(env.build_s, 3),
        provider=env.provider,
        extensions_dir=env.extensions_dir,
    )


def item_device(launch: LaunchResult) -> str | None:
    """The device type the ranks ran on, as the first rank that set one up recorded it."""
    return next((rec.device for rec in launch.records.values() if rec and rec.device), None)


def _rank_summary(rank: int, rec: RankRecord | None, launch: LaunchResult) -> RankSummary:
    told = rec.ran_as.rank if rec is not None and rec.ran_as is not None else None
    moved = {"ran_as_rank": told} if told is not None and told != rank else {}
    return RankSummary(
        rank=rank,
        status=rec.status if rec else "missing",
        phase=rec.phase if rec else None,
        exitcode=launch.rank_exitcodes.get(rank),
        error_type=rec.error.type if rec and rec.error else None,
        log_tail=launch.rank_tails.get(rank, ""),
        **moved,
    )


def ranks_as_run(launch: LaunchResult) -> tuple[int, list[str]]:
    """The world size the ranks ran in, as they saw it, and what differs from the launch, said: a
    repro's own settings (a script's ``env:``) can tell its ranks another world or rank than the
    one they were launched as; the record describes what they ran as, never only the launch."""
    told = {r: rec.ran_as for r, rec in sorted(launch.records.items()) if rec is not None and rec.ran_as is not None}
    worlds = sorted({a.world_size for a in told.values() if a.world_size is not None})
    said: list[str] = []
    world = launch.world_size
    if len(worlds) == 1 and worlds[0] != launch.world_size:
        world = worlds[0]
        said.append(
            f"the ranks ran as a world of {world} (as their own settings told them), launched as {launch.world_size}: "
            "the record describes the world they ran in"
        )
    elif len(worlds) > 1:
        sizes = ", ".join(f"rank {r}: {a.world_size}" for r, a in told.items() if a.world_size is not None)
        said.append(f"the ranks disagree on their world size ({sizes}), launched as {launch.world_size}")
    moved = {r: a.rank for r, a in told.items() if a.rank is not None and a.rank != r}
    if moved:
        who = ", ".join(f"rank {r} as rank {n}" for r, n in moved.items())
        taken = sorted({n for n in (a.rank for a in told.values()) if n is not None})
        twice = " (so two ranks ran as one)" if len(taken) < len(told) else ""
        said.append(f"ranks were told other ranks than they were launched as: {who}{twice}")
    return world, said


def item_record(
    *,
    run_id: str,
    item: ItemId,
    observation: Observation,
    expected: Expectation | None,
    env: Environment,
    launch: LaunchResult,
    repro_cmd: str,
    item_dir: Path,
    started_at: str,
    finished_at: str,
    **more: JsonValue,
) -> ItemRecord:
    """A launched item's record; ``more``: what the plan or the run adds (explored, the model...)."""
    records = [rec for rec in launch.records.values() if rec is not None]
    versions, listed = versions_seen(env, launch)
    first = next((rec for rec in records if rec.device), None)
    train = next((rec.train for rec in records if rec.rank == 0 and rec.train is not None), None)
    guards = next((rec.guards for rec in records if rec.guards is not None), [])
    error = observation.error
    world_size, as_run = ranks_as_run(launch)
    expectation_fields = _expectation_fields(expected, observation.outcome)
    if "matched" in more:
        expectation_fields["matched"] = more.pop("matched")
    return ItemRecord.model_validate(
        {
            "schema_version": SCHEMA_VERSION,
            "run_id": run_id,
            "cell": item.cell,
            "repro": item.repro,
            "mode": item.mode,
            "outcome": observation.outcome,
            "signature": observation.signature,
            **expectation_fields,
            "versions": versions,
            **({"versions_listed": listed} if listed is not None else {}),
            "to_training_s": round(launch.to_training_s, 3) if launch.to_training_s is not None else None,
            "training_s": round(launch.training_s, 3) if launch.training_s is not None else None,
            "world_size": world_size,
            **({"world_size_launched": launch.world_size} if world_size != launch.world_size else {}),
            "device": first.device if first else None,
            "device_name": first.device_name if first else None,
            "cuda_version": first.cuda_version if first else None,
            "nccl_version": first.nccl_version if first else None,
            "backend": first.backend if first else None,
            "figures": summarise(records),
            "wall_s": round(launch.wall_s, 3),
            "cpu_s": round(sum(r.cpu_s for r in records if r.cpu_s), 3) if any(r.cpu_s for r in records) else None,
            "error": error_summary(error.type, error.message, error.rank, error.traceback) if error else None,
            "reasons": [*observation.reasons, *as_run],
            "guards": guards,
            "losses": train.losses if train else None,
            "ranks": [_rank_summary(rank, rec, launch) for rank, rec in sorted(launch.records.items())],
            "launcher_tail": launch.launcher_tail,
            "leftovers_killed": launch.leftovers_killed,
            "stale_build_locks_removed": launch.stale_build_locks_removed,
            "shm_segments_removed": launch.shm_segments_removed,
            "env": env_summary(env),
            "repro_cmd": repro_cmd,
            "launch_cmd": launch.command,
            "launcher": launch.launcher,
            "item_dir": str(item_dir),
            "started_at": started_at,
            "finished_at": finished_at,
            **more,
        }
    )


def unobserved_record(
    *,
    observation: Observation,
    error_type: str,
    run_id: str,
    item: ItemId,
    world_size: int,
    repro_cmd: str,
    started_at: str,
    finished_at: str,
    **more: JsonValue,
) -> ItemRecord:
    """An item that could not run at all (no environment, a repro that does not load), as ``classify``
    said why (``observation``: its outcome and its reason)."""
    outcome = observation.outcome
    reason = observation.reasons[0] if observation.reasons else ""
    return ItemRecord.model_validate(
        {
            "schema_version": SCHEMA_VERSION,
            "run_id": run_id,
            "cell": item.cell,
            "repro": item.repro,
            "mode": item.mode,
            "outcome": outcome,
            "signature": None,
            # Nothing ran, so there are no versions to look an expectation up by.
            **_expectation_fields(None, outcome),
            "versions": tracked_versions(None),
            "world_size": world_size,
            "device": None,
            "backend": None,
            "figures": summarise([]),
            "wall_s": 0.0,
            "error": error_summary(error_type, reason, None),
            "reasons": [reason],
            "guards": [],
            "env": None,
            "repro_cmd": repro_cmd,
            "started_at": started_at,
            "finished_at": finished_at,
            **more,
        }
    )
