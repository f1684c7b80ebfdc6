"""A cell's pre-imported worker: imports the heavy packages once, forks fresh ranks per item.

    python -m repros.runtime.cell_server --reply-fd N [--preload torch,deepspeed,...]

A bare ``torchrun`` of one item spends most of its wall importing torch, transformers,
peft and deepspeed in every rank (about 17 s a rank here) against under a second of
training steps. This server, started once per cell in the cell's interpreter, imports
them once (DeepSpeed's CPU shm comm op left unbuilt: ``deepspeed_comm.py``) and then serves items:

* a request (one JSON line on stdin) names the repro module, mode, world size and item
  directory;
* the server forks an **item leader**, which calls ``setsid()`` (a session and process
  group of its own, that the orchestrator kills on timeout) and forks one fresh process
  per rank. Each rank runs ``rank_main.main`` with torchrun's environment (RANK,
  WORLD_SIZE, MASTER_ADDR/PORT on a free port, ...): a process group of its own, per
  item, so a crash or hang in one item cannot touch the next one;
* like torchrun, the leader stops the other ranks (SIGTERM, then SIGKILL after a grace)
  once one has failed, and writes ``launcher.json`` (each rank's exit code, negative for
  a signal, which ranks it stopped itself, and what the ranks left running that it killed);
* the leader is a child subreaper (``repros/runtime/lifeline.py``): a process the ranks start
  that leaves their session (a daemon's double fork) is re-parented to it, and killed with
  the item; the worker is one too, and ends whatever is re-parented to it;
* the leader writes its own output, and each rank its log, through the named pipes the
  orchestrator listens on (``repros/runtime/record.py``: ``open_log``), which cap them;
* the server never trains, never initialises a process group, CUDA or OpenMP, so each
  fork starts from the same pristine, freshly imported state. It answers on
  ``--reply-fd`` (one JSON line per event: ``ready``, ``started``, ``exited``); its own
  stdout and stderr go wherever the orchestrator pointed them (a log file).

Only the standard library, the cell's packages and the repros package are imported.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import select
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from repros.runtime.bytecode import keep_compiled
from repros.runtime.deepspeed_comm import forget, leave_unbuilt, recorded, wanted
from repros.runtime.lifeline import become_subreaper, children, join_cgroup, kill_cgroup, kill_descendants
from repros.runtime.rank_main import cpu_seconds
from repros.runtime.record import open_log

#: What a rank of any built-in repro imports; each is imported once, here, and a
#: package the cell lacks is simply reported (its items fail at import as they would).
DEFAULT_PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.utils.checkpoint",
    "torch.distributed.fsdp",
    "transformers",
    "transformers.models.qwen2.modeling_qwen2",
    "peft",
    "accelerate",
    "deepspeed",
    "bitsandbytes",
    "repros.trainer.fixed_trainer",
    "repros.trainer.tiny_models",
)

#: How long the leader waits for the other ranks after one failed, before SIGKILL.
STOP_GRACE_S = 10.0
LAUNCHER_RECORD = "launcher.json"


class OrchestratorGone(Exception):
    """The orchestrator closed our input without asking us to exit, or stopped reading replies."""


def _reply(stream: Any, event: dict[str, Any]) -> None:
    try:
        stream.write(json.dumps(event) + "\n")
        stream.flush()
    except (BrokenPipeError, OSError) as exc:
        raise OrchestratorGone(str(exc)) from None


def _import(name: str) -> tuple[float | None, str | None]:
    """Import ``name``: the seconds it took, or the error it raised (and what it left half-imported forgotten)."""
    started = time.perf_counter()
    before = set(sys.modules)
    try:
        importlib.import_module(name)
    except BaseException as exc:  # noqa: BLE001 - a broken package is reported, not fatal
        forget_orphans(before)
        return None, f"{type(exc).__name__}: {exc}"
    return round(time.perf_counter() - started, 3), None


def forget_orphans(before: set[str]) -> list[str]:
    """Forget the modules a failed import added whose package the failure unloaded again.

    Python drops each module whose code raised, but keeps the submodules that finished meanwhile: a forked rank
    importing the package anew would run its ``__init__`` against those leftovers and meet another error (DeepSpeed
    0.16.3 with triton 3.2 on a CPU: a circular ``ImportError`` instead of triton's "0 active drivers"). Forgotten,
    the rank imports the package as a fresh ``import`` does and meets the error a user meets."""
    orphans = [
        name
        for name in list(sys.modules)
        if name not in before and any(parent not in sys.modules for parent in _packages_of(name))
    ]
    for name in orphans:
        del sys.modules[name]
    return orphans


def _packages_of(name: str) -> list[str]:
    """``a.b.c`` -> ``a``, ``a.b``."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def cuda_present() -> bool:
    """Whether this process could use CUDA, asked without initialising it (torch's NVML-based check,
    ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` in the worker's environment). False before torch is imported."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - a torch that cannot even say has no CUDA to keep unspoiled
        return False


def cuda_initialised() -> bool:
    cuda = getattr(sys.modules.get("torch"), "cuda", None)
    try:
        return bool(cuda is not None and cuda.is_initialized())
    except Exception:  # noqa: BLE001
        return False


def _who_initialised_cuda() -> list[str]:
    """In a probe: wrap torch's CUDA initialisation so the first call names its caller (the frames
    below it that are not torch's own). Filled in the returned list."""
    callers: list[str] = []
    cuda = getattr(sys.modules.get("torch"), "cuda", None)
    original = getattr(cuda, "_lazy_init", None)
    if cuda is None or original is None:
        return callers

    def watched() -> Any:
        if not callers:
            for frame in reversed(traceback.extract_stack()[:-1]):
                if f"{os.sep}torch{os.sep}" not in frame.filename and "cell_server" not in frame.filename:
                    callers.append(f"{frame.filename}:{frame.lineno} in {frame.name}")
                    break
        return original()

    cuda._lazy_init = watched
    return callers


def _probe(modules: list[str]) -> Iterator[dict[str, Any]]:
    """Import ``modules`` in order in a forked probe, one event per module as it is imported: ``ok``,
    ``failed`` (its error), or ``cuda`` (importing it initialised CUDA: the probe stops there, naming
    the caller). A probe that dies mid-import says nothing more of the module it was importing."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the probe: never returns
        os.close(read_end)
        try:
            out = os.fdopen(write_end, "w", buffering=1)
            callers = _who_initialised_cuda()
            for name in modules:
                took, error = _import(name)
                if error is not None:
                    out.write(json.dumps({"module": name, "failed": error}) + "\n")
                elif cuda_initialised():
                    by = callers[0] if callers else "an import that initialised CUDA outside torch's lazy init"
                    out.write(json.dumps({"module": name, "cuda": by}) + "\n")
                    break
                else:
                    out.write(json.dumps({"module": name, "ok": took}) + "\n")
            out.flush()
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        with os.fdopen(read_end, "r") as events:
            for line in events:
                yield json.loads(line)
    finally:
        os.waitpid(pid, 0)


def preload(modules: list[str]) -> tuple[dict[str, float], dict[str, str], dict[str, str]]:
    """Import each module; return the seconds each took, the error of each that failed, and the
    modules left for the ranks to import, each with why.

    Where the process has CUDA, a module whose import initialises it (bitsandbytes asks torch for the
    devices' compute capability as it loads its library) would leave every forked rank unable to use
    CUDA. So once torch is in and says there is CUDA, each further module is first imported in a
    forked probe; the worker imports only what the probe imported without initialising CUDA, right
    behind it, and leaves the rest (each named with the call that initialised CUDA) to the ranks,
    which import it after the fork. Without CUDA (a CPU runner) every module is imported at once."""
    took: dict[str, float] = {}
    failed: dict[str, str] = {}
    deferred: dict[str, str] = {}
    remaining = list(modules)
    cuda: bool | None = None
    while remaining:
        if cuda is None and "torch" in sys.modules:
            cuda = cuda_present()  # asked once: torch's answer does not change
        if cuda:
            break
        name = remaining.pop(0)
        seconds, error = _import(name)
        if error is not None:
            failed[name] = error
        elif seconds is not None:
            took[name] = seconds
    while remaining:
        answered: set[str] = set()
        for event in _probe(remaining):
            name = event["module"]
            answered.add(name)
            if "failed" in event:
                failed[name] = event["failed"]  # not imported here: a failed import leaves half a module
            elif "cuda" in event:
                deferred[name] = f"importing it initialises CUDA ({event['cuda']}): the ranks import it"
            else:
                seconds, error = _import(name)
                if error is not None:
                    failed[name] = error
                elif seconds is not None:
                    took[name] = seconds
        done = [m for m in remaining if m in answered]
        rest = remaining[len(done) :]
        if rest and (not done or done[-1] not in deferred):
            # The probe died importing rest[0]: leave that one to the ranks, go on with the others.
            deferred[rest[0]] = "the probe importing it died: the ranks import it"
            rest = rest[1:]
        remaining = rest
    return took, failed, deferred


def warm_deepspeed_comm_op() -> dict[str, Any]:
    """Where the op is wanted (``FT_REGRESS_DEEPSPEED_SHM_COMM=build``): load it (DeepSpeed builds it
    on first use) here, once, so that forks find it loaded in DeepSpeed's class cache instead of each
    running the JIT's up-to-date check. Otherwise nothing: no item's training uses it."""
    if "deepspeed" not in sys.modules:
        return {}
    if not wanted():
        return {"op": None, "why": "left unbuilt: no item's training uses it"}
    if cuda_present():
        # The op is the CPU accelerator's; on CUDA DeepSpeed uses NCCL and building it would only
        # risk the worker's CUDA staying unspoiled.
        return {"skipped": "a CUDA accelerator: the shared-memory comm op is the CPU accelerator's"}
    started = time.perf_counter()
    try:
        from deepspeed.comm.torch import build_shm_op
    except ImportError:
        return {}
    try:
        op = build_shm_op()
    except BaseException as exc:  # noqa: BLE001 - the items will meet it and report it
        return {"error": f"{type(exc).__name__}: {exc}", "seconds": round(time.perf_counter() - started, 3)}
    said = {"op": getattr(op, "__name__", None), "seconds": round(time.perf_counter() - started, 3), **recorded()}
    forget()  # each fork's rank says it itself, where its own comm backend asks for the op
    return said


def fork_hazards() -> list[str]:
    """What would make forking this process unsafe; the orchestrator falls back to torchrun."""
    hazards = []
    if threading.active_count() > 1:
        hazards.append(f"{threading.active_count()} Python threads running after the imports")
    cuda = getattr(sys.modules.get("torch"), "cuda", None)
    if cuda is not None and cuda.is_initialized():
        hazards.append("CUDA was initialised by the imports (a forked rank could not use it)")
    return hazards


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def rank_environment(request: dict[str, Any], rank: int, port: int, host: str) -> dict[str, str]:
    """The variables torchrun gives a rank of a single-node launch."""
    world_size = int(request["world_size"])
    return {
        **{str(k): str(v) for k, v in request.get("env", {}).items()},
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "GROUP_RANK": "0",
        "ROLE_RANK": str(rank),
        "ROLE_NAME": "default",
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        "ROLE_WORLD_SIZE": str(world_size),
        "GROUP_WORLD_SIZE": "1",
        "MASTER_ADDR": host,
        "MASTER_PORT": str(port),
        "TORCHELASTIC_RUN_ID": str(request.get("id", "none")),
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
    }


def _exit_code(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


#: What each forked rank runs: ``module:function``, called with rank_main's arguments.
RANK_ENTRY = "repros.runtime.rank_main:main"


def _run_rank(request: dict[str, Any], rank: int, port: int, host: str, entry: str) -> int:
    """In the forked rank: torchrun's environment, then rank_main as torchrun would run it."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    os.environ.update(rank_environment(request, rank, port, host))
    argv = ["--module", request["module"], "--mode", request["mode"], "--item-dir", request["item_dir"]]
    argv += ["--params", json.dumps(request.get("params") or {})]
    module_name, _, function = entry.partition(":")
    module = importlib.import_module(module_name)
    sys.argv = [str(getattr(module, "__file__", module_name)), *argv]
    try:
        return int(getattr(module, function)(argv) or 0)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1


def lead_item(request: dict[str, Any], entry: str = RANK_ENTRY) -> int:
    """In the item leader: fork the ranks, supervise them like torchrun, record how each ended.
    If the worker that forked it dies (killed with the orchestrator), the leader kills its ranks
    (its own process group) and itself: nothing of the item outlives the run."""
    worker = os.getppid()
    join_cgroup(request.get("cgroup"))
    # Every process of the item stays the leader's descendant, whatever session it makes.
    become_subreaper()
    # A timeout's SIGTERM is for the ranks (each resets it): the leader stays to kill what they
    # leave and to say how each ended; the orchestrator kills it last.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    host = "127.0.0.1"
    port = free_port(host)
    world_size = int(request["world_size"])
    ranks: dict[int, int] = {}
    for rank in range(world_size):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _run_rank(request, rank, port, host, entry)
            except BaseException:  # noqa: BLE001 - rank_main records its own errors; this is a last resort
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        ranks[pid] = rank
    print(f"item {request.get('id')}: ranks {sorted(ranks.values())} as pids {sorted(ranks)}, rendezvous {host}:{port}")
    codes: dict[int, int] = {}
    stopped: list[int] = []
    stop_deadline: float | None = None
    killed_by_us = False
    while len(codes) < world_size:
        if os.getppid() != worker:
            print("the cell's worker is gone: killing the item's processes", flush=True)
            kill_descendants(reap=True)
            kill_cgroup(request.get("cgroup"))
            os.killpg(0, signal.SIGKILL)
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            if stop_deadline is not None and time.monotonic() > stop_deadline:
                for other, rank in ranks.items():
                    if rank not in codes:
                        _signal(other, signal.SIGKILL)
                stop_deadline = float("inf")
                killed_by_us = True
            time.sleep(0.02)
            continue
        if pid not in ranks:
            continue  # a rank's own child re-parented here: not ours to report
        rank = ranks[pid]
        codes[rank] = _exit_code(status)
        print(f"rank {rank} (pid {pid}) exited with {codes[rank]}")
        if rank in stopped and codes[rank] == -signal.SIGKILL and not killed_by_us:
            stopped.remove(rank)  # it died of a SIGKILL we never sent: its own death, not our stop
        if codes[rank] != 0 and stop_deadline is None:
            # torchrun's behaviour: one rank failed, so the others are stopped. A rank that has
            # already ended is reaped first, never counted as stopped: a peer's error ("connection
            # reset") is often reaped before the death that caused it (waitpid returns children
            # in fork order).
            for other, other_rank in ranks.items():
                if other_rank in codes:
                    continue
                try:
                    done, other_status = os.waitpid(other, os.WNOHANG)
                except ChildProcessError:
                    done = 0
                if done:
                    codes[other_rank] = _exit_code(other_status)
                    print(f"rank {other_rank} (pid {other}) exited with {codes[other_rank]}")
                    continue
                stopped.append(other_rank)
                _signal(other, signal.SIGTERM)
            stop_deadline = time.monotonic() + STOP_GRACE_S
    # What the ranks left running (a daemon in a session of its own, a child of a rank that ended):
    # re-parented to the leader, which ends it with the item.
    leftovers = kill_descendants(reap=True)
    if leftovers:
        print(f"killed what the ranks left running: pids {leftovers}", flush=True)
    record = {
        "ranks": {str(r): c for r, c in sorted(codes.items())},
        "stopped": sorted(stopped),
        "port": port,
        "leftovers_killed": leftovers,
    }
    (Path(request["item_dir"]) / LAUNCHER_RECORD).write_text(json.dumps(record))
    return 0 if all(code == 0 for code in codes.values()) and len(codes) == world_size else 1


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _start_item(request: dict[str, Any], close_fds: list[int], entry: str) -> int:
    item_dir = Path(request["item_dir"])
    item_dir.mkdir(parents=True, exist_ok=True)
    pid = os.fork()
    if pid:
        return pid
    code = 70
    try:
        os.setsid()
        # The leader and its ranks never read the requests nor write the replies.
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        for fd in close_fds:
            os.close(fd)
        log = open_log(item_dir / "launcher.log")
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        code = lead_item(request, entry)
    except BaseException:  # noqa: BLE001 - the leader must never return into the server loop
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve(reply_fd: int, modules: list[str], entry: str = RANK_ENTRY) -> int:
    reply = os.fdopen(reply_fd, "w", buffering=1)
    # A process whose item leader died is re-parented here, not to init: it is ended (``_end_strays``).
    become_subreaper()
    started = time.perf_counter()
    # What the imports compile is kept for the environment's next starts (and its ranks inherit it).
    keep_compiled()
    leave_unbuilt()  # before DeepSpeed is imported: its forks start their comm backend without the op
    took, failed, deferred = preload(modules)
    comm_op = warm_deepspeed_comm_op()
    _reply(
        reply,
        {
            "event": "ready",
            "pid": os.getpid(),
            "python": sys.executable,
            "import_s": round(time.perf_counter() - started, 3),
            "cpu_s": cpu_seconds(),  # the imports' work, done once for the cell's items
            "preloaded": took,
            "failed": failed,
            "deferred": deferred,
            "cuda": cuda_present(),
            "comm_op": comm_op,
            "hazards": fork_hazards(),
        },
    )
    leaders: dict[int, str] = {}
    try:
        _serve_items(reply, reply_fd, leaders, entry)
    except OrchestratorGone as exc:
        # Nobody will time the items out or read their records: end them now.
        print(f"the orchestrator is gone ({exc}): killing {len(leaders)} item(s) in flight", flush=True)
        for pid in leaders:
            kill_descendants(pid)  # the leader last: what its ranks left is re-parented to it
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        kill_descendants(reap=True)
        for pid in list(leaders):
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        return 1
    return 0


#: How often the worker looks for processes re-parented to it (their item's leader died).
STRAY_CHECK_S = 1.0


def _end_strays(leaders: dict[int, str], own: set[int]) -> None:
    """Kill the processes re-parented to this worker (an item's, whose leader died): any child
    that is neither an item leader nor one its imports had started before it served."""
    for pid in children(os.getpid()):
        if pid not in leaders and pid not in own:
            kill_descendants(pid)
            _signal(pid, signal.SIGKILL)


def _serve_items(reply: Any, reply_fd: int, leaders: dict[int, str], entry: str) -> None:
    stdin = sys.stdin.fileno()
    buffer = b""
    open_input = True
    strays_checked = time.monotonic()
    own = set(children(os.getpid()))
    while open_input or leaders:
        if time.monotonic() - strays_checked > STRAY_CHECK_S:
            strays_checked = time.monotonic()
            _end_strays(leaders, own)
        readable, _, _ = select.select([stdin] if open_input else [], [], [], 0.05)
        if readable:
            chunk = os.read(stdin, 65536)
            if not chunk:
                # Input closed without an "exit" request: the orchestrator died (or was killed).
                raise OrchestratorGone("its end of the request pipe closed")
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                if not line.strip():
                    continue
                request = json.loads(line)
                if request.get("op") == "exit":
                    open_input = False
                    continue
                pid = _start_item(request, [reply_fd], entry)
                leaders[pid] = str(request["id"])
                _reply(reply, {"event": "started", "id": request["id"], "pid": pid})
        while leaders:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            item = leaders.pop(pid, None)
            if item is not None:
                _reply(reply, {"event": "exited", "id": item, "pid": pid, "code": _exit_code(status)})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reply-fd", type=int, required=True)
    parser.add_argument("--preload", default=",".join(DEFAULT_PRELOAD), help="comma-separated modules")
    parser.add_argument("--rank-entry", default=RANK_ENTRY, help="module:function each rank runs (tests)")
    args = parser.parse_args(argv)
    return serve(args.reply_fd, [m for m in args.preload.split(",") if m], args.rank_entry)


if __name__ == "__main__":
    sys.exit(main())
