"""Entry point of one rank, started by torchrun in a cell's environment.

    python -m torch.distributed.run --standalone --nproc_per_node N \
        -m repros.runtime.rank_main --module repros.catalog.f1_... --mode bug --item-dir DIR

It imports only the standard library, the cell's packages and the repros package.
It sends its own stdout/stderr to ``DIR/rank<R>.log`` (through the orchestrator's pipe for it,
which keeps the log's head and tail, capped), writes ``DIR/rank<R>.json`` (a ``RankRecord``,
``repros/runtime/record.py``: the one declaration both sides read) when it starts, as it
enters each phase (``import``, ``setup``, ``run``, ``teardown``) and when it ends, and on an
exception leaves at once with a non-zero status so that torchrun stops the other ranks.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import faulthandler
import json
import os
import platform
import resource
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from repros.runtime.bytecode import keep_compiled
from repros.runtime.context import Meters, RankContext, imported_versions, installed_versions
from repros.runtime.deepspeed_comm import leave_unbuilt, recorded
from repros.runtime.families import DEFAULT_FAMILY, use_family
from repros.runtime.lifeline import die_with_parent
from repros.runtime.loading import load_repro
from repros.runtime.model_size import use_size
from repros.runtime.record import (
    ERROR,
    OK,
    RUNNING,
    UNAVAILABLE,
    Measured,
    RankError,
    RankRecord,
    ScenarioUnavailable,
    open_log,
    ran_as,
    rank_log_path,
    write_rank_record,
)
from repros.runtime.stack_failure import stack_failure

#: How long a collective may block before the process group gives up on its own.
#: The orchestrator's per-item timeout is the real bound; this only keeps a rank
#: from outliving it by much if the orchestrator itself is gone.
PROCESS_GROUP_TIMEOUT_S = 900


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def cpu_seconds() -> float:
    """The CPU seconds this process (since it started, or was forked) and its waited-for children used."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return round(own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime, 3)


def _qualified_name(exc: BaseException) -> str:
    return _qualified_name_of(type(exc))


def _qualified_name_of(cls: type) -> str:
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"


def _redirect_output(log_path: Path) -> Any:
    # Through the orchestrator's pipe where it listens: it keeps the log's head and tail, capped.
    log = os.fdopen(open_log(log_path), "w", buffering=1, encoding="utf-8", errors="replace")
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    # Fatal signals (SIGSEGV, SIGABRT...) print every thread's stack to the log,
    # and SIGUSR1 does so on demand: the orchestrator sends it before killing a hung item.
    faulthandler.enable(file=log, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=log, all_threads=True, chain=False)
    return log


def _verdicts(spec: Any, error: RankError, facts: Any) -> dict[str, bool]:
    verdicts = {}
    for signature in spec.signatures:
        try:
            verdicts[signature.id] = bool(signature.matches(error.type, error.message, facts))
        except Exception:  # noqa: BLE001 - a check that fails does not match
            verdicts[signature.id] = False
    return verdicts


def _setup_device(local_rank: int, world_size: int) -> tuple[Any, str]:
    import torch
    import torch.distributed as dist

    if torch.cuda.is_available():
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        if torch.cuda.device_count() < local_world:
            raise ScenarioUnavailable(
                f"{local_world} ranks on this node need {local_world} GPUs; {torch.cuda.device_count()} visible"
            )
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend=backend, timeout=dt.timedelta(seconds=PROCESS_GROUP_TIMEOUT_S))
    return device, backend


def _device_only(local_rank: int) -> tuple[Any, str | None]:
    """The device a script that sets up torch.distributed itself will find (nothing initialised)."""
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda", local_rank), None
    return torch.device("cpu"), None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--module", required=True, help="the repro module (dotted name) or its file (.py, .yaml)")
    parser.add_argument("--mode", required=True)
    parser.add_argument("--item-dir", required=True, type=Path)
    parser.add_argument("--params", default="{}", help="what the item asks beyond repro and mode (JSON)")
    args = parser.parse_args(argv)
    params = json.loads(args.params)

    # A rank dies with whatever started it (the item leader, or torchrun): nothing of an item
    # outlives its launcher, even when the orchestrator above it is killed.
    die_with_parent(os.getppid())
    keep_compiled()  # what this rank's imports compile, kept for the environment (done where forked)
    leave_unbuilt()  # DeepSpeed's CPU shm comm op: no training uses it (done where forked too)
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    item_dir: Path = args.item_dir.resolve()  # a script repro changes the working directory
    _redirect_output(rank_log_path(item_dir, rank))

    started = time.perf_counter()
    record = RankRecord(
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        pid=os.getpid(),
        mode=args.mode,
        status=RUNNING,
        phase="import",
        started_at=_now(),
        versions=installed_versions(),
        python_version=platform.python_version(),
        # The rendezvous: DeepSpeed names its /dev/shm segments after it, and the
        # orchestrator removes them after the item by these names.
        master_addr=os.environ.get("MASTER_ADDR"),
        master_port=os.environ.get("MASTER_PORT"),
    )
    write_rank_record(item_dir, rank, record)

    exit_code = 0
    ctx: RankContext | None = None
    spec = None
    try:
        # The repro first (a failure here is the repro's file, not the scenario): it says whether
        # it sets up torch.distributed itself (a user's script) or the rank does it for it.
        repro = load_repro(args.module, params)
        spec = repro.spec
        # Each phase is on disk as it is entered: a rank that hangs is named in the phase it hung in.
        record = record.evolve(phase="setup")
        write_rank_record(item_dir, rank, record)
        if repro.owns_process_group:
            device, backend = _device_only(local_rank)
        else:
            device, backend = _setup_device(local_rank, world_size)
        record = record.evolve(device=device.type, backend=backend)
        if device.type == "cuda":
            import torch

            try:
                nccl = torch.cuda.nccl.version()  # a tuple in recent torch, an int in old releases
                nccl_version: str | None = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
            except (AttributeError, RuntimeError):
                nccl_version = None
            record = record.evolve(
                device_name=torch.cuda.get_device_name(device),
                cuda_version=torch.version.cuda,
                nccl_version=nccl_version,
            )
        write_rank_record(item_dir, rank, record)
        size = use_size(str(params.get("model") or "tiny"))
        family = use_family(str(params.get("family") or DEFAULT_FAMILY))
        ctx = RankContext(
            rank=rank,
            local_rank=local_rank,
            world_size=world_size,
            device=device,
            backend=backend or "",
            steps=int(params.get("steps") or size.steps or spec.steps),
            warmup_steps=int(params.get("warmup_steps") or size.warmup_steps or spec.warmup_steps),
            mode=args.mode,
            meters=Meters.for_device(device),
            params=params,
        )
        record = record.evolve(model=size.name, family=family.name, phase="run")
        write_rank_record(item_dir, rank, record)
        repro.run(ctx)
        record = record.evolve(status=OK)
    except ScenarioUnavailable as exc:
        record = record.evolve(status=UNAVAILABLE, unavailable_reason=str(exc))
        exit_code = 3
    except BaseException as exc:  # noqa: BLE001 - every failure is data here
        error = RankError(
            type=_qualified_name(exc),
            # What it is a kind of, each base as a traceback would name it: a declaration that names
            # a base class is told so.
            bases=[_qualified_name_of(base) for base in type(exc).__mro__[1:] if base is not object],
            message=str(exc),
            traceback=traceback.format_exc(),
            # A package that does not import, or one the cell lacks: the stack's failure, not the
            # scenario's (INFRA unless a documented signature names it).
            stack_failure=stack_failure(exc),
        )
        if spec is not None:
            # Signatures with checks of the repro's own are judged here, where their code is; the
            # orchestrator of a user's repro never runs that code and reads these verdicts.
            facts = ctx.facts.get("scenario_facts") if ctx is not None else None
            error = dataclasses.replace(error, signature_verdicts=_verdicts(spec, error, facts))
        record = record.evolve(status=ERROR, error=error)
        exit_code = 1
        traceback.print_exc()
    finally:
        if ctx is not None:
            # The repro's facts stay under their own key: a fact never overwrites the record's fields.
            record = record.evolve(
                measures={name: Measured.of(result) for name, result in ctx.meters.results().items()},
                warmup_steps=ctx.warmup_steps,
                facts=ctx.facts,
                training_began_at=ctx.meters.training_began_at,
                training_ended_at=ctx.meters.training_ended_at,
            )
        record = record.evolve(
            # What this rank imported (or would import, by its own sys.path): the record's versions.
            versions_imported=imported_versions(),
            wall_s=time.perf_counter() - started,
            cpu_s=cpu_seconds(),  # the work it did (and its children), whatever shared its cores
            # What became of DeepSpeed's shm comm op, where its comm backend asked.
            deepspeed_shm_comm=recorded().get("deepspeed_shm_comm"),
            finished_at=_now(),
            ran_as=ran_as(),  # who its code was told it is, which its own settings may change
        )
        write_rank_record(item_dir, rank, record)

    sys.stdout.flush()
    sys.stderr.flush()
    if exit_code:
        # Leave without tearing down the process group: a peer may be blocked in a
        # collective, and torchrun stops the remaining ranks once one has failed.
        os._exit(exit_code)
    import torch.distributed as dist

    if dist.is_initialized():
        # Its work is recorded; a hang from here on is the process group's teardown.
        record = record.evolve(phase="teardown")
        try:
            write_rank_record(item_dir, rank, record)
        except OSError:
            pass  # what it did is recorded already
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
