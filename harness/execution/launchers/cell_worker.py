"""The orchestrator's side of a cell's pre-imported worker (``repros/runtime/cell_server.py``).

One worker process per cell environment imports torch, transformers, peft and deepspeed
once; every item is then a fresh fork of it: an item leader in a session of its own that
forks the ranks, with torchrun's environment and a rendezvous of its own. What the
orchestrator does around an item is the same as for a torchrun launch (``launch``): the
ranks' logs copied through pipes and capped, a timeout that asks the ranks for their stacks
and then kills the item's processes (the leader, the item's subreaper, last), the cgroup,
token and session sweeps, DeepSpeed's shared-memory segments removed, and the ranks'
records read back into a ``LaunchResult``.

A worker that cannot start (a package that fails to import is not that: its items fail
as they would under torchrun), or whose imports left the process unsafe to fork (threads,
an initialised CUDA), is reported as unavailable and the runner launches that cell's
items with torchrun instead, saying why. On a GPU the worker keeps CUDA uninitialised: a module
whose import would initialise it (bitsandbytes) is found by a forked probe and left to the ranks
(``deferred``), so the ranks still fork warm.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import secrets
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness.core.json import JsonValue
from harness.environments import Environment
from harness.execution.containment.leftovers import in_flight_item
from harness.execution.containment.processes import TOKEN_VARIABLE, sweep, sweep_session
from harness.execution.launchers.base import LaunchRequest
from harness.execution.launchers.diagnose import identity
from harness.execution.launchers.logs import LogPump
from harness.execution.launchers.result import LaunchResult, collect_item, tail
from harness.execution.launchers.supervision import (
    end_item_cgroup,
    end_item_tree,
    extensions_in_use,
    item_cgroup,
    rank_environment,
    signal_group,
    stop_timed_out_item,
    track_in_flight,
    untrack_in_flight,
    worker_root,
)
from repros.runtime.record import rank_log_path

#: The first start of a worker in a new environment JIT-builds DeepSpeed's comm op (~40 s here).
READY_TIMEOUT_S = 900.0
#: How long a request may wait for the worker to say it forked the item.
START_TIMEOUT_S = 60.0
LAUNCHER_RECORD = "launcher.json"
#: A message of the worker protocol (JSON lines on the worker's stdin and reply pipe).


class WorkerGone(Exception):
    """The worker was closed or died before it forked the item: nothing ran, so the item can
    be sent again (to a new worker)."""


class WorkerUnavailable(Exception):
    """The cell's worker could not be started or is unsafe to fork from."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class WorkerInfo:
    """What the worker said when it was ready, and how long starting it took."""

    pid: int
    start_s: float
    import_s: float
    preloaded: dict[str, float]
    failed: dict[str, str]
    comm_op: dict[str, Any]
    hazards: list[str] = field(default_factory=list)
    #: Modules the worker left for the ranks to import, each with why (importing it initialises CUDA).
    deferred: dict[str, str] = field(default_factory=dict)
    #: Whether the worker's torch saw CUDA devices (asked without initialising CUDA).
    cuda: bool = False
    #: Build locks a killed JIT build had left in the environment's extensions dir, removed.
    stale_build_locks_removed: list[str] = field(default_factory=list)
    #: The CPU seconds its imports took (once for the cell's items), where it said.
    cpu_s: float | None = None


class CellWorker:
    """One pre-imported worker for one environment; safe to use from several threads."""

    def __init__(
        self,
        env: Environment,
        log_path: Path,
        ready_timeout_s: float = READY_TIMEOUT_S,
        server_args: tuple[str, ...] = (),
    ):
        """``server_args``: more arguments for the server (``--preload``, ``--rank-entry``: tests)."""
        self.server_args = server_args
        self.env = env
        self.log_path = log_path
        self.ready_timeout_s = ready_timeout_s
        self.info: WorkerInfo | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._events: dict[str, queue.Queue[dict[str, Any]]] = {}
        self._ready: queue.Queue[dict[str, Any]] = queue.Queue()
        self._lock = threading.Lock()
        self._dead = False
        self._held = contextlib.ExitStack()
        #: Items this worker is running now, and when it last started one (for the pool's LRU).
        self.in_flight = 0
        self.last_used = 0.0
        #: Whether an item asked for it (one started ahead of its cell's items has not been, yet).
        self.served = False

    # -- life ----------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self._proc is not None and not self._dead and self._proc.poll() is None

    def start(self) -> WorkerInfo:
        started = time.perf_counter()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # The worker builds and loads JIT ops in the environment's extensions dir for
        # as long as it lives: hold it like a launch does.
        stale_locks = self._held.enter_context(extensions_in_use(Path(self.env.extensions_dir)))
        read_end, write_end = os.pipe()
        environment = rank_environment(self.env, 1)
        # torch.cuda.is_available() through NVML: it must not initialise CUDA before a fork.
        environment["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [self.env.python, "-m", "repros.runtime.cell_server", "--reply-fd", str(write_end), *self.server_args],
                cwd=worker_root(),
                env=environment,
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(write_end,),
                start_new_session=True,
            )
        os.close(write_end)
        threading.Thread(target=self._read_replies, args=(read_end,), daemon=True).start()
        try:
            ready = self._ready.get(timeout=self.ready_timeout_s)
        except queue.Empty:
            self.close()
            raise WorkerUnavailable(f"the worker was not ready within {self.ready_timeout_s:.0f} s") from None
        if ready.get("event") != "ready":
            self.close()
            raise WorkerUnavailable(f"the worker exited before it was ready: {tail(self.log_path, 600).strip()}")
        self.info = WorkerInfo(
            pid=int(ready["pid"]),
            start_s=time.perf_counter() - started,
            import_s=float(ready["import_s"]),
            preloaded=dict(ready.get("preloaded", {})),
            failed=dict(ready.get("failed", {})),
            comm_op=dict(ready.get("comm_op", {})),
            hazards=list(ready.get("hazards", [])),
            deferred=dict(ready.get("deferred", {})),
            cuda=bool(ready.get("cuda", False)),
            stale_build_locks_removed=list(stale_locks),
            cpu_s=float(ready["cpu_s"]) if isinstance(ready.get("cpu_s"), (int, float)) else None,
        )
        if self.info.hazards:
            self.close()
            raise WorkerUnavailable("forking the worker is unsafe: " + "; ".join(self.info.hazards))
        return self.info

    def _read_replies(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as stream:
            for line in stream:
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if event.get("event") == "ready":
                    self._ready.put(event)
                    continue
                with self._lock:
                    box = self._events.get(str(event.get("id")))
                if box is not None:
                    box.put(event)
        self._dead = True
        eof = {"event": "eof"}
        self._ready.put(eof)
        with self._lock:
            for box in self._events.values():
                box.put(eof)

    def close(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(BrokenPipeError, OSError, ValueError):
                assert proc.stdin is not None
                proc.stdin.write(b'{"op": "exit"}\n')
                proc.stdin.flush()
                proc.stdin.close()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                signal_group(proc.pid, signal.SIGKILL)
                proc.wait()
        elif proc is not None and proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        self._dead = True
        self._held.close()

    def close_in_background(self) -> threading.Thread:
        """``close`` on a thread of its own: the worker takes no more items from now on, and the caller
        does not wait the second or two its interpreter takes to exit (a run changing cells)."""
        self._dead = True
        closing = threading.Thread(target=self.close, name=f"close-{self.log_path.stem}", daemon=True)
        closing.start()
        return closing

    def kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            signal_group(self._proc.pid, signal.SIGKILL)
        self._dead = True

    # -- items ---------------------------------------------------------------------------
    def _send(self, message: dict[str, JsonValue]) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        with self._lock:
            self._proc.stdin.write((json.dumps(message) + "\n").encode())
            self._proc.stdin.flush()

    def launch(self, request: LaunchRequest) -> LaunchResult:
        item_dir = request.item_dir
        item_dir.mkdir(parents=True, exist_ok=True)
        token = secrets.token_hex(8)
        with in_flight_item(token, item_dir):
            return self._launch(request, token)

    def _launch(self, request: LaunchRequest, token: str) -> LaunchResult:
        module, mode, world_size = request.module, request.mode, request.world_size
        item_dir, timeout_s = request.item_dir, request.timeout_s
        request_id = token
        group = item_cgroup(token)
        dir_before = identity(item_dir)
        # The leader's output and each rank's log come through pipes the orchestrator caps.
        pump = LogPump()
        for path in [item_dir / "launcher.log", *(rank_log_path(item_dir, r) for r in range(world_size))]:
            pump.listen(path)
        pump.start()
        hung: dict[int, str] = {}
        box: queue.Queue[dict[str, Any]] = queue.Queue()
        with self._lock:
            self._events[request_id] = box
        message: dict[str, JsonValue] = {
            "op": "launch",
            "id": request_id,
            "module": module,
            "mode": mode,
            "world_size": world_size,
            "item_dir": str(item_dir),
            "cgroup": str(group.path) if group else None,
            "params": dict(request.params),
            # What differs per item from the worker's own environment.
            "env": {TOKEN_VARIABLE: token, "LOCAL_SIZE": str(world_size), **request.extra_env},
        }
        command = [
            self.env.python,
            "-m",
            "repros.runtime.cell_server",
            f"(worker pid {self.info.pid if self.info else '?'})",
        ]
        command += ["--module", module, "--mode", mode, "--item-dir", str(item_dir), "--world-size", str(world_size)]
        launched_at = time.time()
        started = time.perf_counter()
        timed_out = False
        returncode: int | None = None
        leader: int | None = None
        notes: list[str] = []
        with self._lock:
            self.in_flight += 1
            self.last_used = time.monotonic()
        try:
            try:
                if self._dead:
                    raise WorkerGone("the worker was closed before the item was sent")
                self._send(message)
                event = box.get(timeout=START_TIMEOUT_S)
            except (BrokenPipeError, OSError, ValueError) as exc:
                raise WorkerGone(f"the worker could not take the item: {exc}") from exc
            except queue.Empty:
                # A worker that stops answering is replaced; this item is reported, not retried.
                self.kill()
                event = {"event": "eof"}
                notes.append(f"the worker did not fork the item within {START_TIMEOUT_S:.0f} s")
            if event.get("event") == "started":
                leader = int(event["pid"])
                track_in_flight(leader)

                def ends_within(limit_s: float) -> bool:
                    nonlocal event
                    try:
                        event = box.get(timeout=limit_s)
                    except queue.Empty:
                        return False
                    return True

                if not ends_within(max(0.0, timeout_s - (time.perf_counter() - started))):
                    timed_out = True
                    hung = stop_timed_out_item(item_dir, world_size, leader, ends_within)
                    if event.get("event") == "started":
                        ends_within(10.0)  # killed: the worker reaps the leader and says so
                if event.get("event") == "exited":
                    returncode = int(event["code"])
            if event.get("event") == "eof":
                if leader is None and not notes:
                    raise WorkerGone("the worker ended before it forked the item")
                notes.append(f"the cell's worker died; its log ends: {tail(self.log_path, 600).strip()}")
        finally:
            with self._lock:
                self._events.pop(request_id, None)
                self.in_flight -= 1
            leftovers: list[int] = []
            if leader is not None:
                # The leader is the item's subreaper: its descendants go first, then its group.
                leftovers += end_item_tree(leader)
                untrack_in_flight(leader)
                leftovers += sweep_session(leader)
            # What left the leader's tree too (a process that moved itself) is still in the cgroup.
            leftovers += end_item_cgroup(group)
            leftovers += sweep(token)
            leftovers += _leader_killed(item_dir / LAUNCHER_RECORD)
            pump.finish()
        wall_s = time.perf_counter() - started
        if notes:
            try:
                with open(item_dir / "launcher.log", "a", encoding="utf-8") as fh:
                    fh.write("\n".join(notes) + "\n")
            except OSError:
                pass  # a full disk, a directory removed: the item's reason says which
        return collect_item(
            command,
            item_dir,
            world_size,
            returncode,
            timed_out,
            wall_s,
            leftovers,
            rank_exitcodes=_failed_rank_codes(item_dir / LAUNCHER_RECORD),
            launcher="worker",
            logs=list(pump.logs.values()),
            dir_before=dir_before,
            scan_root=request.scan_root,
            hung=hung,
            launched_at=launched_at,
        )


class LeaderReport(BaseModel):
    """``launcher.json``: how each rank ended (exit code, negative for a signal) and which ranks
    the item's leader stopped itself after a peer failed."""

    model_config = ConfigDict(frozen=True, extra="allow")

    ranks: dict[int, int] = Field(default_factory=dict)
    stopped: list[int] = Field(default_factory=list)
    #: What the ranks left running (re-parented to the leader), killed by it before it ended.
    leftovers_killed: list[int] = Field(default_factory=list)


def _leader_killed(path: Path) -> list[int]:
    try:
        return LeaderReport.model_validate_json(path.read_bytes()).leftovers_killed
    except (OSError, ValidationError):
        return []


def _failed_rank_codes(path: Path) -> dict[int, int]:
    """Exit codes of the ranks that failed on their own (not those the leader stopped)."""
    try:
        report = LeaderReport.model_validate_json(path.read_bytes())
    except (OSError, ValidationError):
        return {}
    return {rank: code for rank, code in report.ranks.items() if code != 0 and rank not in set(report.stopped)}


#: Idle workers kept alive at most (each holds a full set of imports, ~0.6 GiB here).
MAX_IDLE_WORKERS = 2
#: Workers alive at once, at most, counting those started ahead of their cell's first item
#: (``prepare``): one running items, two ahead (a cell of two items is over before one could start).
MAX_LIVE_FOR_AHEAD = 3


class WorkerPool:
    """One worker per environment, started on first use (or ahead of it, ``prepare``) and restarted
    after a death; beyond ``max_idle`` live workers, the least recently used idle ones are closed."""

    def __init__(self, log_dir: Path, server_args: tuple[str, ...] = (), max_idle: int = MAX_IDLE_WORKERS) -> None:
        self.log_dir = log_dir
        self.server_args = server_args
        self.max_idle = max_idle
        self._workers: dict[str, CellWorker] = {}
        self._unavailable: dict[str, str] = {}
        self._cells: dict[str, str] = {}
        self._lock = threading.Condition()
        #: Workers being started now, by environment (``get`` waits for one rather than start another).
        self._starting: dict[str, CellWorker] = {}
        #: Cells whose items are queued, whose worker is started ahead once few enough are alive.
        self._ahead: list[tuple[Environment, str]] = []
        self._ahead_thread: threading.Thread | None = None
        self._closed = False
        #: Retired workers still exiting (``close_in_background``): waited for by ``close``.
        self._closing: list[threading.Thread] = []

    @staticmethod
    def _key(env: Environment) -> str:
        return f"{env.key}:{env.python}"

    def get(self, env: Environment, name: str, ahead: bool = False) -> CellWorker | None:
        """The environment's live worker, or None (with ``reason(env)``) where it cannot run one;
        ``ahead``: started before an item asks for it (``prepare``)."""
        key = self._key(env)
        with self._lock:
            self._cells.setdefault(name, key)
            while True:
                worker = self._workers.get(key)
                if worker is not None and worker.alive:
                    worker.served = worker.served or not ahead
                    return worker
                if key in self._unavailable:
                    return None
                if key not in self._starting:
                    break
                self._lock.wait()  # started ahead, or by another item of the cell: that one
            if worker is not None:
                worker.close()
            worker = CellWorker(env, self.log_dir / f"worker-{name}.log", server_args=self.server_args)
            self._starting[key] = worker
            self._close_idle(keep=key)
        try:
            worker.start()  # without the pool's lock: another cell's item may start meanwhile
        except WorkerUnavailable as exc:
            with self._lock:
                if not self._closed:
                    self._unavailable[key] = exc.reason
                self._starting.pop(key, None)
                self._lock.notify_all()
            return None
        except BaseException:
            with self._lock:
                self._starting.pop(key, None)
                self._lock.notify_all()
            raise
        with self._lock:
            self._starting.pop(key, None)
            self._lock.notify_all()
            if self._closed:  # closed while it started: nothing will use it
                worker.close_in_background()
                return None
            worker.served = not ahead
            self._workers[key] = worker
        return worker

    def prepare(self, env: Environment, name: str) -> None:
        """The cell's items are queued: start its worker ahead of its first item, on a thread of the
        pool's, once fewer than ``MAX_LIVE_FOR_AHEAD`` workers are alive."""
        with self._lock:
            if self._closed:
                return
            self._ahead.append((env, name))
            if self._ahead_thread is None:
                self._ahead_thread = threading.Thread(target=self._start_ahead, name="workers-ahead", daemon=True)
                self._ahead_thread.start()
            self._lock.notify_all()

    def _live(self) -> int:
        return sum(1 for w in self._workers.values() if w.alive) + len(self._starting)

    def _start_ahead(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._closed or (self._ahead and self._live() < MAX_LIVE_FOR_AHEAD))
                if self._closed:
                    return
                env, name = self._ahead.pop(0)
                key = self._key(env)
                worker = self._workers.get(key)
                if (worker is not None and worker.alive) or key in self._unavailable or key in self._starting:
                    continue
            self.get(env, name, ahead=True)

    def _close_idle(self, keep: str) -> None:
        # Not one started ahead whose cell's items have not come yet: they will.
        idle = [
            (w.last_used, k)
            for k, w in self._workers.items()
            if k != keep and w.alive and w.in_flight == 0 and w.served
        ]
        for _, key in sorted(idle)[: max(0, len(idle) - self.max_idle + 1)]:
            self._workers[key].close()

    def retire(self, env: Environment) -> None:
        """Close the environment's worker (its cell is done) without waiting for it to exit; a later
        ``get`` starts a new one."""
        with self._lock:
            worker = self._workers.get(self._key(env))
            if worker is not None:
                self._closing = [t for t in self._closing if t.is_alive()]
                self._closing.append(worker.close_in_background())
            self._lock.notify_all()  # one fewer alive: the next cell's may start ahead

    def abort(self) -> None:
        """Kill every worker now (an interrupt); the items they forked are killed by their groups."""
        with self._lock:
            self._closed = True
            self._ahead.clear()
            self._lock.notify_all()
            workers = [*self._workers.values(), *self._starting.values()]
        for worker in workers:
            worker.kill()

    def reason(self, env: Environment) -> str:
        return self._unavailable.get(self._key(env), "")

    def started_by_cell(self) -> dict[str, WorkerInfo]:
        """The last worker started for each cell (by the cell's name)."""
        found = {}
        for name, key in self._cells.items():
            worker = self._workers.get(key)
            if worker is not None and worker.info is not None:
                found[name] = worker.info
        return found

    def unavailable_by_cell(self) -> dict[str, str]:
        return {name: self._unavailable[key] for name, key in self._cells.items() if key in self._unavailable}

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._ahead.clear()
            self._lock.notify_all()
            self._lock.wait_for(lambda: not self._starting, timeout=READY_TIMEOUT_S)
            for worker in self._workers.values():
                worker.close()
            closing, self._closing = self._closing, []
        for thread in closing:
            thread.join()  # each within close's own bound (10 s, then SIGKILL)
