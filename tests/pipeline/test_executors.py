"""``--executor``: where items run. What a user notices: an item whose node died under it is run
again and its lost attempt is kept as INFRA naming the node, never a classified outcome; an item
lost every time is INFRA; a node's environment reaches ``run.json``; an item's files come back into
the run directory; options of one executor given to another are refused with exit 2; and a lane
run as submitit jobs (its local executor: no Slurm daemon here) gives the records a local run does.
The real Ray cluster with a node killed is ``tests/integration/test_executors_real.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, cast

import pytest
from pydantic import ValidationError

from harness.cli import options
from harness.core.errors import UserError
from harness.core.option import Option
from harness.environments import Resolved
from harness.execution.classify import Observation
from harness.pipeline.dispatch import Dispatch
from harness.pipeline.executors import EXECUTORS, Attempted, ItemJob, ItemLost, check_choice
from harness.pipeline.executors.base import no_placement
from harness.pipeline.executors.node import NodeResult, _pack, unpack_item
from harness.pipeline.item_records import unobserved_record
from harness.pipeline.item_runner import LOST_RETRIES
from harness.planning.items import PlannedItem, plan_items
from harness.planning.run_options import ExecutorChoice
from harness.records.item import ItemRecord
from harness.records.results import read_results
from harness.records.run_dir import RunDir
from harness.records.run_meta import CellMeta
from repros.runtime.outcomes import Outcome
from repros.runtime.registry import RegistryClash
from tests.support import fake_stack
from tests.support.paths import REPO_ROOT


class StandIn:
    """An executor whose nodes die on cue: ``losses[label]`` attempts of an item are lost first."""

    name = "stand-in"
    builds_environments = False

    def __init__(self, losses: dict[str, int], retry: bool = True) -> None:
        self.losses = dict(losses)
        self.retry = retry
        self.calls: dict[str, int] = {}

    def in_flight(self) -> int:
        return 2

    def submit_cell(self, jobs: Sequence[ItemJob]) -> None:
        pass

    def place(self, item: PlannedItem) -> AbstractContextManager[Sequence[str]]:
        return no_placement()

    def attempt(self, job: ItemJob, resolved: Resolved | None, gpus: Sequence[str]) -> Attempted:
        label = job.item.id.label()
        self.calls[label] = self.calls.get(label, 0) + 1
        if self.losses.get(label, 0) >= self.calls[label]:
            raise ItemLost(f"node-{self.calls[label]}", "NodeDiedError: the raylet died", retry=self.retry)
        record = unobserved_record(
            observation=Observation(Outcome.PASS, reasons=("ran",)),
            error_type="",
            run_id=job.run_id,
            item=job.item.id,
            world_size=job.item.world_size,
            repro_cmd=job.repro_cmd,
            started_at="t",
            finished_at="t",
        ).evolve(error=None, node="node-ok")
        return Attempted(record, CellMeta(key="k", provider="stand-in"), "node-ok")

    def cell_done(self, resolved: Resolved | None) -> None:
        pass

    def abort(self) -> None:
        pass

    def close(self) -> None:
        pass

    def describe(self) -> dict[str, Any]:
        return {"name": self.name}

    def workers(self) -> dict[str, Any]:
        return {}


@pytest.fixture
def planned(tmp_path: Path) -> Iterator[tuple[Any, list[PlannedItem]]]:
    fake_stack.write_repro(tmp_path / "repros", "R1", "raise", "REPRODUCED")
    fake_stack.write_matrix(tmp_path / "matrix.yaml", ["a", "b"])
    opts = options.selection({"matrix": tmp_path / "matrix.yaml", "repros_dir": [tmp_path / "repros"]})
    yield opts, plan_items(opts).items


def dispatch_all(
    opts: Any, items: list[PlannedItem], executor: StandIn, tmp_path: Path
) -> tuple[list[ItemRecord], dict]:
    got: list[ItemRecord] = []
    cells: dict[str, CellMeta] = {}

    def on_cell(cell: str, meta: CellMeta) -> None:
        assert cell not in cells, "a cell's environment is said once"
        cells[cell] = meta

    dispatch = Dispatch(opts, "run-1", RunDir(tmp_path / "out"), executor, got.append, on_cell=on_cell)
    for cell in sorted({i.cell.name for i in items}):
        dispatch.submit([i for i in items if i.cell.name == cell], None)
    dispatch.drain()
    return got, cells


def test_an_item_whose_node_died_runs_again_and_keeps_the_lost_attempt_as_infra(tmp_path: Path, planned) -> None:
    opts, items = planned
    lost_item = items[0].id.label()
    got, cells = dispatch_all(opts, items, StandIn({lost_item: 1}), tmp_path)
    assert sorted(r.id.label() for r in got) == sorted(i.id.label() for i in items), "one record per item"
    [record] = [r for r in got if r.id.label() == lost_item]
    assert record.outcome == Outcome.PASS and record.node == "node-ok"
    [lost] = record.attempts
    assert lost.outcome == Outcome.INFRA and lost.error_type == "NodeLost"
    assert "node-1" in lost.message and "raylet died" in lost.message
    assert any("run again after its node was lost: attempt lost on node-1" in r for r in record.reasons)
    assert all(not r.attempts for r in got if r.id.label() != lost_item)
    assert set(cells) == {"a", "b"}, "each node's environment is kept for run.json"


def test_an_item_lost_every_time_is_infra_naming_each_node(tmp_path: Path, planned) -> None:
    opts, items = planned
    label = items[0].id.label()
    got, _ = dispatch_all(opts, items, StandIn({label: LOST_RETRIES + 1}), tmp_path)
    [record] = [r for r in got if r.id.label() == label]
    assert record.outcome == Outcome.INFRA and not record.matched
    assert record.error is not None and record.error.type == "NodeLost"
    assert all(f"node-{n}" in record.error.message for n in range(1, LOST_RETRIES + 2))
    assert len(record.attempts) == LOST_RETRIES


def test_an_item_no_node_can_take_is_infra_at_once(tmp_path: Path, planned) -> None:
    opts, items = planned
    label = items[0].id.label()
    executor = StandIn({label: 5}, retry=False)
    got, _ = dispatch_all(opts, items, executor, tmp_path)
    assert executor.calls[label] == 1, "nothing is retried that cannot fit"
    [record] = [r for r in got if r.id.label() == label]
    assert record.outcome == Outcome.INFRA


#: A Slurm job's process as submitit runs it: SIGTERM let by (submitit waits for a requeue signal instead);
#: the item's work is stopped by the same SIGTERM Slurm sends every process of a cancelled job.
CANCELLED_JOB = """
import os, signal, sys
from harness.pipeline.executors import slurm
signal.signal(signal.SIGTERM, lambda *_: print("submitit: bypassing SIGTERM", flush=True))
def item_stopped_by_slurm(job, settings, node=None):
    os.kill(os.getpid(), signal.SIGTERM)
    return "a record made of what the signal had killed"
slurm.run_on_node = item_stopped_by_slurm
print("result:", slurm._job_main(None, None, sys.argv[1]), flush=True)
"""


def test_a_slurm_job_cancelled_mid_item_ends_without_a_result(tmp_path: Path) -> None:
    # A result would be taken as the item's record (an environment "without saying why": UNRESOLVABLE);
    # without one the item is lost and runs again.
    job = subprocess.run(
        [sys.executable, "-c", CANCELLED_JOB, str(tmp_path / "marker")],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=60,
    )
    assert job.returncode == -15, job.stdout + job.stderr
    assert "result:" not in job.stdout
    assert (tmp_path / "marker").read_text(), "the job said where it ran before it was stopped"


def test_an_items_files_from_a_node_land_in_the_run_directory(tmp_path: Path, planned) -> None:
    opts, items = planned
    node_dir = tmp_path / "node" / "items" / "a" / "R1-bug"
    node_dir.mkdir(parents=True)
    (node_dir / "rank0.json").write_text('{"rank": 0}')
    (node_dir / "logs").mkdir()
    (node_dir / "logs" / "rank0.log").write_text("trained")
    record = (
        StandIn({})
        .attempt(ItemJob("run-1", items[0], opts.discovery.repros["R1"], "cmd"), None, ())
        .record.evolve(item_dir=str(node_dir))
    )
    run_dir = RunDir(tmp_path / "out")
    landed = unpack_item(NodeResult(Attempted(record), _pack(node_dir)), run_dir)
    item_dir = run_dir.item_dir(record.id)
    assert landed.as_json()["item_dir"] == str(item_dir)
    assert (item_dir / "rank0.json").read_text() == '{"rank": 0}'
    assert (item_dir / "logs" / "rank0.log").read_text() == "trained"


def harness(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize(
    ("given", "said"),
    [
        (["--ray-address", "127.0.0.1:6379"], "127.0.0.1:6379: is for --executor ray; add --executor ray"),
        (["--slurm-param", "cluster=local"], "--slurm-param"),
        (["--executor", "slurm", "--slurm-param", "partition"], "is not NAME=VALUE"),
    ],
)
def test_an_option_of_another_executor_is_refused_with_exit_2(tmp_path: Path, given: list[str], said: str) -> None:
    fake_stack.write_matrix(tmp_path / "matrix.yaml", ["a"])
    done = harness("run", "--matrix", str(tmp_path / "matrix.yaml"), "--out", str(tmp_path / "out"), *given)
    assert done.returncode == 2, done.stdout + done.stderr
    assert said in done.stderr
    assert not (tmp_path / "out" / "results.jsonl").exists()


class _Labelled:
    """An executor that declares one option (and is never made)."""

    needs = None
    options: tuple[Option, ...] = (Option("label", ("--label",), "a label"),)


def test_an_executors_option_that_takes_another_ones_or_a_built_in_flag_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(EXECUTORS, "labelled", _Labelled)
    assert options.executor_options()["label"].pytest_flags == ("--repro-label",)
    # A second executor declaring the same flag: refused naming both, never one shadowing the other.
    monkeypatch.setitem(EXECUTORS, "relabelled", _Labelled)
    with pytest.raises(RegistryClash, match="'label' .*labelled; relabelled"):
        options.executor_options()
    monkeypatch.delitem(EXECUTORS, "relabelled")
    # One taking a flag of the harness's own (--jobs): refused, never a second --jobs.
    jobs = type("Jobs", (_Labelled,), {"options": (Option("threads", ("--jobs",), "threads"),)})
    monkeypatch.setitem(EXECUTORS, "jobs", jobs)
    with pytest.raises(RegistryClash, match="'--jobs' .*built into ft-regress"):
        options.executor_options()


def test_an_executor_option_nobody_declares_is_refused_never_dropped() -> None:
    with pytest.raises(UserError, match="no option of any installed executor"):
        check_choice(ExecutorChoice(executor="local", executor_options={"colour": "red"}))
    with pytest.raises(ValidationError, match="ray_adress"):
        ExecutorChoice.model_validate({"executor": "ray", "ray_adress": "127.0.0.1:6379"})


def test_a_lane_as_submitit_jobs_gives_the_records_of_a_local_run(tmp_path: Path) -> None:
    env = fake_stack.run_env(fake_stack.install(tmp_path))
    fake_stack.write_repro(tmp_path / "repros", "R1", "raise", "REPRODUCED")
    fake_stack.write_repro(tmp_path / "repros", "R2", "pass", "NOT_REPRODUCED")
    fake_stack.write_matrix(tmp_path / "matrix.yaml", ["a", "b"])
    common = ["run", "--matrix", str(tmp_path / "matrix.yaml"), "--repros-dir", str(tmp_path / "repros")]
    local = harness(*common, "--out", str(tmp_path / "local"), env=env)
    assert local.returncode == 0, local.stdout + local.stderr
    jobs = harness(
        *common, "--out", str(tmp_path / "jobs"), "--executor", "slurm", "--slurm-param", "cluster=local", env=env
    )
    assert jobs.returncode == 0, jobs.stdout + jobs.stderr

    def seen(out: str) -> dict[tuple[str, str, str], str]:
        return {r.key: r.outcome for r in read_results(tmp_path / out / "results.jsonl")}

    assert seen("jobs") == seen("local") and len(seen("jobs")) == 4
    records = list(read_results(tmp_path / "jobs" / "results.jsonl"))
    assert all(r.node for r in records), "each record names the node that ran it"
    assert all((tmp_path / "jobs" / "items" / r.cell / f"{r.repro}-{r.mode}" / "rank0.json").exists() for r in records)
    meta = json.loads((tmp_path / "jobs" / "run.json").read_text())
    assert meta["concurrency"]["executor"] == "slurm" and meta["concurrency"]["cluster"] == "local"
    # Asked for, and said plainly as the run starts (and kept): no Slurm ran these jobs.
    local_note = "--executor slurm with cluster=local: submitit runs every item on this machine, not through Slurm"
    assert f"note: {local_note}" in jobs.stdout and meta["concurrency"]["note"] == local_note
    assert set(meta["cells"]) == {"a", "b"}
    assert meta["options"]["executor"] == "slurm"
    assert meta["options"]["executor_options"] == {"slurm_param": ["cluster=local"]}


def test_slurm_where_there_is_none_is_refused_never_run_here_in_silence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 40, class 5: submitit falls back to this machine where it finds no Slurm; the harness
    refuses instead, in one line, unless cluster=local asks for exactly that."""
    fake_stack.write_matrix(tmp_path / "matrix.yaml", ["a"])
    no_slurm = tmp_path / "no-slurm-on-path"
    no_slurm.mkdir()
    env = {**os.environ, "PATH": str(no_slurm)}
    done = harness("run", "--matrix", str(tmp_path / "matrix.yaml"), "--out", str(tmp_path / "out"),
                   "--executor", "slurm", env=env)  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and "finds no Slurm here (no srun on PATH)" in done.stderr
    assert "--slurm-param cluster=local" in done.stderr and not (tmp_path / "out").exists()
    # Where srun is found, nothing is refused (submitit submits to Slurm).
    from harness.pipeline.executors.slurm import check_options

    (no_slurm / "srun").write_text("#!/bin/sh\n")
    (no_slurm / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", str(no_slurm))
    check_options(ExecutorChoice(executor="slurm"))


def test_a_local_ray_cluster_started_for_the_run_runs_the_lane(tmp_path: Path) -> None:
    """Without --ray-address, the run starts its own Ray cluster (from the main thread: Ray's daemons
    die with the thread that starts them) and its items run there."""
    env = {**fake_stack.run_env(fake_stack.install(tmp_path)), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    env.pop("RAY_ADDRESS", None)
    fake_stack.write_repro(tmp_path / "repros", "R1", "raise", "REPRODUCED")
    fake_stack.write_matrix(tmp_path / "matrix.yaml", ["a"])
    done = harness("run", "--matrix", str(tmp_path / "matrix.yaml"), "--repros-dir", str(tmp_path / "repros"),
                   "--executor", "ray", "--out", str(tmp_path / "out"), env=env)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (record,) = read_results(tmp_path / "out" / "results.jsonl")
    assert record.outcome == "REPRODUCED" and record.node
    meta = json.loads((tmp_path / "out" / "run.json").read_text())
    assert meta["concurrency"]["address"] == "a local cluster started for the run"


def test_a_slurm_array_task_is_named_as_squeue_and_sacct_name_it() -> None:
    from harness.pipeline.executors.slurm import host_of, slurm_job_id

    assert slurm_job_id({"SLURM_JOB_ID": "8", "SLURM_ARRAY_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "0"}) == "7_0"
    assert slurm_job_id({"SLURM_JOB_ID": "10"}) == "10"
    assert slurm_job_id({}) is None
    assert host_of("gpu-node-3/job 7_0") == "gpu-node-3" and host_of("vm") == "vm"


def test_a_slurm_job_never_seen_to_end_is_lost_once_past_its_limit_but_a_queued_one_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness.pipeline.executors import slurm

    class Handle:
        job_id = "7_0"
        cancelled = False

        def __init__(self) -> None:
            self.polls = 0

        def done(self) -> bool:
            self.polls += 1
            return self.polls > 5 and not marker.exists()  # queued five polls, then ends if it never started

        def cancel(self, check: bool = False) -> None:
            Handle.cancelled = True

    executor = object.__new__(slurm.SlurmExecutor)
    executor.parameters = {"timeout_min": 0}
    executor._lock = __import__("threading").Lock()
    executor.lost = 0
    monkeypatch.setattr(slurm, "WAIT_GRACE_S", 0)
    monkeypatch.setattr(slurm, "POLL_S", 0.01)
    marker = tmp_path / "marker"
    queued = Handle()
    executor._wait(queued, marker)  # never started: no clock, it ends on its own
    assert queued.polls == 6 and not Handle.cancelled
    marker.write_text("gpu-node-3/job 7_0")
    with pytest.raises(ItemLost) as lost:
        executor._wait(Handle(), marker)
    assert Handle.cancelled and lost.value.node == "gpu-node-3/job 7_0" and "sacct" in lost.value.reason
    assert executor.lost == 1


def test_a_floating_cell_is_resolved_once_for_every_node(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from harness.config.model import Cell
    from harness.environments import Environments
    from harness.environments.uv import UvEnvironments, UvProvider

    asked = []

    class Builder:  # uv's resolver, standing in: what the floating specs resolve to today
        def lock(self, request: Any) -> SimpleNamespace:
            asked.append(dict(request.packages))
            return SimpleNamespace(lines=("peft==0.15.2", "torch==2.13.0"))

    provider = UvProvider(builder=cast(UvEnvironments, Builder()))
    environments = Environments(tmp_path, providers={"uv": provider})
    floating = Cell(name="watch", packages={"torch": "==2.13.0", "peft": ">=0.15,<0.16"})
    assert environments.lock_for_nodes(floating) == ("peft==0.15.2", "torch==2.13.0")
    assert asked == [{"torch": "==2.13.0", "peft": ">=0.15,<0.16"}]
    assert environments.lock_for_nodes(Cell(name="pinned", packages={"torch": "==2.13.0"})) is None
    assert environments.lock_for_nodes(Cell(name="locked", packages={"peft": "*"}, lock=("peft==0.15.2",))) is None


def test_a_run_stored_before_executors_declared_their_options_resumes_where_it_ran() -> None:
    """A run.json from before kept Ray's and Slurm's options as fields of their own: resuming it reads
    them as the executors' options, never drops them (and a value given now still wins)."""
    from harness.pipeline.executors import ray, slurm

    old_slurm = {
        "executor": "slurm",
        "slurm_folder": "/shared/jobs",
        "slurm_parameters": [["slurm_partition", "gpu"], ["timeout_min", "60"]],
        "launcher": "worker",
        "jobs": 2,
    }
    choice = ExecutorChoice.restored(old_slurm)
    assert choice.name == "slurm" and choice.jobs == 2
    assert slurm.folder(choice) == Path("/shared/jobs")
    assert slurm.parameters(choice) == [("slurm_partition", "gpu"), ("timeout_min", "60")]
    assert ray.address(ExecutorChoice.restored({"executor": "ray", "ray_address": "10.0.0.1:6379"})) == "10.0.0.1:6379"
    newer = ExecutorChoice.restored({**old_slurm, "executor_options": {"slurm_folder": "/elsewhere"}})
    assert slurm.folder(newer) == Path("/elsewhere") and slurm.parameters(newer) == slurm.parameters(choice)
    # A run stored as runs are now is read as it was written.
    assert ExecutorChoice.restored(choice.stored()) == choice
