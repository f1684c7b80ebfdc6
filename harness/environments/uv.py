"""One Python environment per matrix cell, built with uv and reused by key.

The key is a hash of everything that changes what gets installed: the cell's
requirements, the interpreter (its version and path), the find-links and indexes in
force, the date cut-off, uv's version and this module's recipe version. An
environment lives in ``<cache>/envs/<key>/``; it is reused only when its ``READY``
marker exists, which is written last, so an interrupted build is never reused (its
directory is wiped and rebuilt). A lock file per key keeps two runs from building
the same environment at once.

DeepSpeed's setup imports torch, so torch goes in first and DeepSpeed is built without build
isolation against it, without any op (``DS_BUILD_OPS=0``: a pure-Python wheel, cached per
(interpreter, torch, platform, accelerator) pair in a uv cache of its own, never the shared one,
since it records the torch it was built against). Its CPU shared-memory comm op, which every
``deepspeed.init_distributed`` on a CPU would otherwise compile at first use (a minute or more on
two cores), is not built at all: no item's training uses it, and the ranks start DeepSpeed's comm
backend without it (``repros/runtime/deepspeed_comm.py``).

No bytecode is compiled at build: what items import is compiled by their imports, once per
(interpreter, source) across every environment, kept in the cache's store and placed into each
environment holding the same source, listed in its manifest (``bytecode.py``); a build places what
is there already, first for torch (DeepSpeed's setup imports it), then for everything.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import json
import os
import platform
import re
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, fields
from pathlib import Path
from typing import ClassVar

from harness.environments.base import (
    CellRequest,
    Environment,
    EnvironmentUnavailable,
    EnvRequest,
    ProviderContext,
    installer_reason,
)
from harness.environments.bytecode import Placed, interpreter_of, place, place_in_tree, store_dir, write_no_bytecode
from harness.environments.cache import (
    READY_MARKER,
    Eviction,
    Holds,
    budget_bytes,
    disk_full_reason,
    evict_to_fit,
    flock_current,
    is_disk_full,
    largest_environment,
    note_use,
    share_files,
    write_size,
)
from harness.environments.index import IndexConfig
from harness.environments.integrity import damage, describe, write_manifest
from harness.environments.inventory import list_distributions
from harness.environments.locks import DEFAULT_SIMPLE, Lock, ReleaseDates, resolve_lock
from harness.environments.seals import Seals
from harness.environments.specs import NEWEST, requirement
from harness.environments.uv_sources import copied_from, known_digests

#: Bump when the way environments are built changes, so old ones are not reused.
#: 2: JIT ops live inside each environment. 3: DeepSpeed's comm op built ahead of time per pair.
#: 4: files copied from uv's cache (never hard-linked), and a manifest to verify them by.
#: 5: bytecode compiled at build, and a manifest of content digests (``integrity.py``).
#: 6: DeepSpeed without ops, its comm op built once per distinct build and placed in
#:    (``deepspeed_ops.py``), compiled without debug information (``-g0`` now reaches C++).
#: 7: no bytecode compiled at build: what items import, compiled once per (interpreter, source) by
#:    the imports themselves, placed in from the store (``bytecode.py``); nothing run in it writes any.
#: (DeepSpeed's comm op no longer built ahead of time changes nothing a 7 holds: an environment
#: that has it is as good as one that has not: the ranks leave it unloaded unless asked.)
RECIPE_VERSION = 7
#: DeepSpeed installed without any op compiled in.
DEEPSPEED_NO_OPS = {"DS_BUILD_OPS": "0"}
#: A floating request's lock, beside its venv: the constraints every install step honours.
LOCK_FILE = "lock.txt"
#: The packages a cell leaves out (``exclude_packages``), as uv's ``--excludes`` reads them.
EXCLUDES_FILE = "excludes.txt"
ENV_RECORD = "env.json"
UV_TIMEOUT_S = 1800


def find_uv() -> str:
    try:
        from uv import find_uv_bin

        return str(find_uv_bin())
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if found:
            return found
    raise FileNotFoundError("uv is not installed: pip install uv")


def extensions_dir_for(env_dir: Path) -> Path:
    """Where an environment's JIT-compiled ops live: inside the environment itself.

    Not shared between environments, even with the same torch and deepspeed: the
    compile flags name the environment's own torch headers, so two environments
    sharing one directory make ninja rebuild the ops at every switch (measured: the
    shm comm op, ~40 s, rebuilt whenever another environment had used the directory).
    """
    return env_dir / "torch_extensions"


class UvEnvironments:
    """Builds and reuses cell environments under ``cache_dir``."""

    def __init__(self, cache_dir: Path, index: IndexConfig, uv: str | None = None, max_gb: float | None = None) -> None:
        self.cache_dir = Path(cache_dir)
        self.index = index
        self.uv = uv or find_uv()
        #: The cache's budget (``--cache-max-gb``; None: ``cache.budget_bytes``'s default).
        self.max_gb = max_gb
        #: The environments this process may use: never evicted by another (``cache.Holds``).
        self.holds = Holds(self.cache_dir)
        #: Digests verified once, by file identity: the store's copies, uv's cache (``seals.py``).
        self.seals = Seals(self.cache_dir)
        self._uv_cache_dir: Path | None = None
        self._uv_version: str | None = None
        self._pythons: dict[str, tuple[str, str]] = {}
        #: Release dates asked of the index while resolving as of a day (once per package per run).
        self.dates = ReleaseDates(index.index_url or DEFAULT_SIMPLE)
        #: The bytecode store's state (its directory's mtime) each environment was last completed from.
        self._bytecode_seen: dict[str, int] = {}
        #: The installer's processes running now (``cancel`` kills them), and whether it was called.
        self._running: set[subprocess.Popen[bytes]] = set()
        self._running_lock = threading.Lock()
        self._cancelled = threading.Event()

    # -- key -------------------------------------------------------------------------
    def uv_version(self) -> str:
        if self._uv_version is None:
            out = subprocess.run([self.uv, "--version"], capture_output=True, text=True, check=True)
            self._uv_version = out.stdout.strip()
        return self._uv_version

    def uv_caches(self) -> list[Path]:
        """Where uv keeps the wheels it copies into environments: its own cache (``uv cache dir``, as
        the builds' environment names it) and each DeepSpeed pair's (``_install_deepspeed``)."""
        if self._uv_cache_dir is None:
            try:
                out = subprocess.run(
                    [self.uv, "cache", "dir"], capture_output=True, text=True, env=self.uv_environ(), check=False
                )
                found = out.stdout.strip() if out.returncode == 0 else ""
            except OSError:
                found = ""  # no uv cache to take digests from: every file is hashed
            self._uv_cache_dir = Path(found) if found else Path()
        pairs = sorted((self.cache_dir / "deepspeed-ops" / "wheels").glob("*"))
        return [*([self._uv_cache_dir] if self._uv_cache_dir != Path() else []), *pairs]

    def find_python(self, request: str) -> tuple[str, str]:
        """The interpreter uv would use for ``request``: (path, full version)."""
        if request not in self._pythons:
            out = subprocess.run(
                # --system: never the virtual environment uv would find around the cwd
                # (the orchestrator's own .venv), which would tie the key to a checkout.
                [self.uv, "python", "find", "--no-project", "--system", request],
                capture_output=True,
                text=True,
                env=self.uv_environ(),
                check=False,
            )
            if out.returncode < 0:  # stopped, not answering: whether there is one is not known
                raise EnvironmentUnavailable(
                    f"Python {request} was not looked for: {installer_reason(out.stderr, out.returncode)}"
                )
            if out.returncode != 0:
                raise EnvironmentUnavailable(f"no Python {request} on this machine: {installer_reason(out.stderr)}")
            path = out.stdout.strip()
            version = subprocess.run(
                [path, "-c", "import sys; print('.'.join(map(str, sys.version_info[:3])))"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            self._pythons[request] = (path, version)
        return self._pythons[request]

    def key_material(self, request: EnvRequest) -> dict[str, object]:
        python_path, python_version = self.find_python(request.python)
        material: dict[str, object] = {
            "recipe": RECIPE_VERSION,
            # A floating request is keyed by what it resolved to (reused while the lock is the
            # same); exact pins by their requirement strings, as they always were.
            **({"lock": list(request.lock)} if request.lock is not None else {"requirements": request.requirements()}),
            "python": {"request": request.python, "version": python_version, "path": python_path},
            "index": self.index.key_material(),
            "exclude_newer": request.exclude_newer,
            "uv": self.uv_version(),
            "platform": sys.platform,
        }
        if request.exclude_packages:
            # Only when there are some: every environment built without exclusions keeps its key.
            material["exclude_packages"] = sorted(request.exclude_packages)
        return material

    def key(self, request: EnvRequest) -> str:
        material = json.dumps(self.key_material(request), sort_keys=True)
        return hashlib.sha256(material.encode()).hexdigest()[:20]

    # -- build / reuse -----------------------------------------------------------------
    def env_dir(self, key: str) -> Path:
        return self.cache_dir / "envs" / key

    @property
    def bytecode_store(self) -> Path:
        return store_dir(self.cache_dir)

    @contextmanager
    def _try_locked(self, key: str) -> Iterator[bool]:
        """The build lock of ``key`` if it is free now (True), else nothing (False)."""
        lock_path = self.cache_dir / "envs" / f"{key}.lock"
        try:
            handle = open(lock_path, "a")  # noqa: SIM115 - closed below
        except OSError:
            yield False
            return
        with handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                yield False
                return
            yield True

    @contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        lock_path = self.cache_dir / "envs" / f"{key}.lock"
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        with flock_current(lock_path, fcntl.LOCK_EX) as fh:
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def get(self, request: EnvRequest, cell: str | None = None) -> Environment:
        """The environment for ``request``: reused when it is whole, else built (or rebuilt once),
        held for this process and its use by ``cell`` recorded (``cache.py``)."""
        key = self.key(request)
        with self._locked(key):
            # Held before anything is read: an eviction that starts now skips it, and one already
            # under way has finished (and removed it) by the time the hold is granted.
            self.holds.hold(key)
            env_dir = self.env_dir(key)
            repaired: str | None = None
            if (env_dir / READY_MARKER).exists():
                env, problem = self._reusable(env_dir)
                if env is not None:
                    self._used(key, env_dir, cell)
                    return env
                repaired = f"rebuilt: the cached environment {env_dir} was damaged ({problem})"
            elif (env_dir / "DAMAGED").is_file():
                repaired = f"rebuilt: {(env_dir / 'DAMAGED').read_text().strip()}"
            if env_dir.exists():
                shutil.rmtree(env_dir)  # an interrupted, failed or damaged build: never reuse it
            self.make_room(keep=key)
            started = time.perf_counter()
            try:
                env = self._build(request, key, env_dir)
                steps = {"install": time.perf_counter() - started}
                tree = Path(env.python).parent.parent
                site = site_packages(env.python)
                if site is not None:
                    write_no_bytecode(site)  # nothing run in it from now on writes bytecode into it
                # What uv copied unchanged from its cache has that file's digest (hashed once, not per
                # environment): sharing and the manifest hash only the rest (``uv_sources.py``).
                known = known_digests(site, copied_from(site, self.uv_caches()), self.seals) if site else {}
                shared = share_files(tree, self.cache_dir, known, self.seals)
                steps["share"] = time.perf_counter() - started - sum(steps.values())
                # The manifest reuses the digests sharing computed; then the bytecode other
                # environments' items compiled from the same sources, listed in it as it is placed.
                write_manifest(env_dir, tree, {**known, **shared.digests})
                steps["manifest"] = time.perf_counter() - started - sum(steps.values())
                interpreter = interpreter_of(env.python, self.uv_environ())
                placed = place(env_dir, self.bytecode_store, interpreter, ready=False) if interpreter else Placed(0)
                steps["bytecode"] = time.perf_counter() - started - sum(steps.values())
                env = Environment(
                    **{
                        **asdict(env),
                        "build_s": time.perf_counter() - started,
                        "build_steps": {k: round(v, 1) for k, v in steps.items()},
                        "repaired": repaired,
                        "interpreter": interpreter,
                        "bytecode_store": str(self.bytecode_store) if interpreter else None,
                    }
                )
                (env_dir / ENV_RECORD).write_text(json.dumps(asdict(env), indent=1, sort_keys=True))
                (env_dir / "key.json").write_text(json.dumps(self.key_material(request), indent=1, sort_keys=True))
                write_size(env_dir)
                counts = {**shared.counts(), "digests_known": len(known), "bytecode_placed": placed.files}
                (env_dir / "shared.json").write_text(json.dumps(counts))
                (env_dir / READY_MARKER).write_text(time.strftime("%Y-%m-%dT%H:%M:%S%z"))
            except EnvironmentUnavailable as exc:
                shutil.rmtree(env_dir, ignore_errors=True)
                reason = disk_full_reason(self.cache_dir) if is_disk_full(f"{exc.reason}\n{exc.log}") else exc.reason
                if repaired:
                    raise EnvironmentUnavailable(f"{repaired}, and the rebuild failed: {reason}", exc.log) from None
                raise EnvironmentUnavailable(reason, exc.log) from None
            except OSError as exc:
                shutil.rmtree(env_dir, ignore_errors=True)
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise EnvironmentUnavailable(disk_full_reason(self.cache_dir)) from None
                raise
            except BaseException:
                shutil.rmtree(env_dir, ignore_errors=True)
                raise
            self._used(key, env_dir, cell)
            return env

    def _used(self, key: str, env_dir: Path, cell: str | None) -> None:
        self.holds.hold(key)
        note_use(env_dir, cell or "?")

    def make_room(self, keep: str) -> Eviction:
        """Before a build: evict the least recently used environments not in use until the cache and
        one more environment (the largest so far) fit in the budget."""
        budget = budget_bytes(self.cache_dir, self.max_gb)
        incoming = largest_environment(self.cache_dir)
        return evict_to_fit(self.cache_dir, budget, incoming, keep={keep, *self.holds.held()})

    def release(self, key: str) -> None:
        """This process no longer needs the environment: another may evict it."""
        self.holds.release(key)

    def _reusable(self, env_dir: Path) -> tuple[Environment | None, str]:
        """The cached environment if it is whole, else None and what is wrong with it."""
        try:
            record = json.loads((env_dir / ENV_RECORD).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None, f"{ENV_RECORD} is missing"
        except (OSError, ValueError) as exc:
            return None, f"{ENV_RECORD} cannot be read ({exc})"
        if not isinstance(record, dict):
            return None, f"{ENV_RECORD} is not an object"
        known = {f.name for f in fields(Environment)}
        # A newer checkout may add fields: what this one does not know is left out, not fatal.
        try:
            env = Environment(**{**{k: v for k, v in record.items() if k in known}, "reused": True, "build_s": 0.0})
        except TypeError as exc:
            return None, f"{ENV_RECORD} lacks a field ({exc})"
        # First: a cache moved or copied names the original's files (integrity.moved).
        problems = damage(env_dir, self.seals)
        if problems:
            return None, describe(problems)
        if not Path(env.python).is_file() or not os.access(env.python, os.X_OK):
            return None, f"its interpreter {env.python} is missing"
        return env, ""

    def verify(self, env: Environment) -> list[str]:
        """What changed in ``env`` since it was built ([] when nothing did). Where nothing did, the
        bytecode its items (or another environment's) compiled since into the store is placed in and
        listed (``bytecode.py``), for its next imports: looked for only when the store has changed."""
        if env.path is None:
            return []
        env_dir = Path(env.path)
        problems = damage(env_dir, self.seals)
        if problems or env.interpreter is None or env.bytecode_store is None:
            return problems
        store = Path(env.bytecode_store)
        try:
            seen = (store / env.interpreter).stat().st_mtime_ns
        except OSError:
            return problems
        if self._bytecode_seen.get(env.key) != seen:
            with self._try_locked(env.key) as locked:
                # Not while another process rebuilds it, nor once it is no longer ready.
                if locked and (env_dir / READY_MARKER).exists():
                    place(env_dir, store, env.interpreter)
                    self._bytecode_seen[env.key] = seen
        return problems

    def invalidate(self, env: Environment, reason: str) -> None:
        """Mark a damaged environment so the next use rebuilds it (and say why, beside it)."""
        if env.path is None:
            return
        env_dir = Path(env.path)
        with self._locked(env.key):
            (env_dir / READY_MARKER).unlink(missing_ok=True)
            if env_dir.is_dir():  # gone altogether (evicted, deleted): nothing to mark, the next use builds it
                (env_dir / "DAMAGED").write_text(reason + "\n")

    def uv_environ(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH"}}
        env["UV_PYTHON_DOWNLOADS"] = "never"
        # The build's own Python processes (DeepSpeed's setup) leave no bytecode in the environment, and uv
        # compiles none: what items import is compiled by the imports and placed from the store (``bytecode.py``).
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.pop("UV_COMPILE_BYTECODE", None)
        env.setdefault("UV_NO_PROGRESS", "1")
        return env

    def _uv(self, args: list[str], log: Path, extra_env: dict[str, str] | None = None) -> float | None:
        """uv with ``args``, its output appended to ``log``; the CPU seconds it took (what it waited
        for included: a compiler under it), or None where that is not known."""
        with open(log, "a") as fh:
            fh.write(f"$ {' '.join(f'{k}={v}' for k, v in (extra_env or {}).items())} uv {' '.join(args)}\n")
            fh.flush()
            out, cpu_s = self._run([self.uv, *args], {**self.uv_environ(), **(extra_env or {})})
            fh.write(out.stdout + out.stderr + f"(exit {out.returncode})\n")
        if out.returncode != 0:
            raise EnvironmentUnavailable(installer_reason(out.stderr, out.returncode), log=out.stderr)
        return cpu_s

    def _run(self, command: list[str], environ: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
        """``command`` to its end (``UV_TIMEOUT_S`` at most), in a process group of its own that
        ``cancel`` kills with everything it started (a compiler under uv, say); and the CPU seconds of
        that process and what it waited for (its own, whatever else this process runs meanwhile)."""
        if self._cancelled.is_set():
            raise EnvironmentUnavailable("the run was interrupted before this environment was built")
        proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environ, start_new_session=True
        )
        with self._running_lock:
            self._running.add(proc)
        try:
            stdout, stderr = _read_both(proc, time.monotonic() + UV_TIMEOUT_S)
            _, status, usage = os.wait4(proc.pid, 0)  # reaped here: its own resource usage
            proc.returncode = os.waitstatus_to_exitcode(status)
        except BaseException:  # a timeout, an interrupt on this thread: nothing of it outlives us
            _kill_group(proc)
            raise
        finally:
            with self._running_lock:
                self._running.discard(proc)
        if self._cancelled.is_set():
            raise EnvironmentUnavailable("the run was interrupted while this environment was built")
        text = (stdout.decode(errors="replace"), stderr.decode(errors="replace"))
        return subprocess.CompletedProcess(command, proc.returncode, *text), usage.ru_utime + usage.ru_stime

    def cancel(self) -> None:
        """Stop every build under way (their process groups killed) and start none from now on."""
        self._cancelled.set()
        with self._running_lock:
            running = list(self._running)
        for proc in running:
            _kill_group(proc)

    def lock(self, request: EnvRequest) -> Lock:
        """What ``request``'s floating specs resolve to now (or as of its day): ``locks.py``."""
        return resolve_lock(self, request, self.dates)

    def resolve(
        self,
        requirements: list[str],
        python: str,
        exclude_newer: str | None,
        exclude_packages: tuple[str, ...] = (),
        as_of: str | None = None,
    ) -> dict[str, str]:
        """What ``requirements`` resolve to (package -> version) without installing
        anything: with ``exclude_newer``, nothing newer (pins included); with ``as_of``, as a floating cell
        resolves as of that day (pins as written, the rest released before it); ``exclude_packages`` left out."""
        packages = dict(_split(r) for r in requirements)
        request = EnvRequest(
            packages=packages,
            python=python,
            exclude_newer=exclude_newer,
            exclude_packages=exclude_packages,
            as_of=as_of,
        )
        return resolve_lock(self, request, self.dates).versions()

    def _install_args(self, python: str, request: EnvRequest) -> list[str]:
        # Copies, never hard links into uv's cache: an edit in one environment must not reach
        # the cache, a rebuild, or any other environment.
        args = ["pip", "install", "--link-mode", "copy", "--python", python, *self.index.uv_args()]
        if request.exclude_newer:
            args += ["--exclude-newer", request.exclude_newer]
        if request.exclude_packages:
            # Written by _build beside the venv (python is <env>/venv/bin/python).
            args += ["--excludes", str(Path(python).parent.parent.parent / EXCLUDES_FILE)]
        if request.lock is not None:
            # Every package at its locked version: the lock is what the environment is keyed by.
            args += ["--constraints", str(Path(python).parent.parent.parent / LOCK_FILE)]
        return args

    def _build(self, request: EnvRequest, key: str, env_dir: Path) -> Environment:
        python_path, _ = self.find_python(request.python)
        env_dir.mkdir(parents=True)
        log = env_dir / "build.log"
        venv = env_dir / "venv"
        cpu_s = self._uv(["venv", "--no-project", "--python", python_path, str(venv)], log) or 0.0
        python = str(venv / "bin" / "python")
        if request.exclude_packages:
            write_excludes(env_dir, request.exclude_packages)
        packages = dict(request.packages)
        if request.lock is not None:
            (env_dir / LOCK_FILE).write_text("".join(f"{line}\n" for line in request.lock), encoding="utf-8")
            locked = request.locked_versions()
            packages = {name: f"=={locked[name]}" for name in packages if name in locked}
        deepspeed_ops = None
        if "deepspeed" in packages and "torch" in packages:
            # DeepSpeed's setup imports torch: install torch (and setuptools, which its
            # build needs without isolation, and ninja, which it compiles with) first,
            # then build DeepSpeed against it.
            first = [requirement("torch", packages["torch"]), "setuptools", "wheel", "ninja"]
            cpu_s += self._uv([*self._install_args(python, request), *first], log) or 0.0
            interpreter = interpreter_of(python, self.uv_environ())
            if interpreter is not None:  # DeepSpeed's setup imports torch: compiled once, not by every build
                place_in_tree(venv, self.bytecode_store, interpreter)
            packages["torch"] = f"=={list_distributions(python).packages['torch']}"
            deepspeed_ops = self._install_deepspeed(python, request, packages, log)
            spent = deepspeed_ops.get("cpu_s")
            cpu_s += spent if isinstance(spent, (int, float)) else 0.0
        requirements = [requirement(name, spec) for name, spec in sorted(packages.items())]
        extra = ["--no-build-isolation-package", "deepspeed"] if "deepspeed" in packages else []
        cpu_s += self._uv([*self._install_args(python, request), *extra, *requirements], log) or 0.0
        listing = list_distributions(python)
        present = sorted(set(request.exclude_packages) & set(listing.packages))
        if present:  # uv honours --excludes; this only guards against an installer that did not
            raise EnvironmentUnavailable(f"excluded packages were installed anyway: {', '.join(present)}")
        return Environment(
            key=key,
            python=python,
            python_version=listing.python_version,
            packages=listing.packages,
            path=str(env_dir),
            extensions_dir=str(extensions_dir_for(env_dir)),
            reused=False,
            build_s=0.0,
            deepspeed_ops=deepspeed_ops,
            lock=request.lock,
            build_cpu_s=round(cpu_s, 1),
        )

    def ops_pair_key(self, python: str, torch_version: str) -> str:
        """What a DeepSpeed wheel built against torch (without ops) is only right for."""
        material = {
            "python": python_identity(python),
            "torch": torch_version,
            "platform": [sys.platform, platform.machine()],
            # DeepSpeed picks its accelerator (and so which ops exist) from the host.
            "gpu_host": shutil.which("nvidia-smi") is not None,
            "uv": self.uv_version(),
            "switches": DEEPSPEED_NO_OPS,
        }
        return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:16]

    def _install_deepspeed(
        self, python: str, request: EnvRequest, packages: dict[str, str], log: Path
    ) -> dict[str, object]:
        """DeepSpeed without ops, from its pair's wheel (built by DeepSpeed's setup the first time the
        pair meets the release). Its comm op is not built (``repros/runtime/deepspeed_comm.py``)."""
        pair = self.ops_pair_key(python, packages["torch"].lstrip("="))
        started = time.perf_counter()
        install = [*self._install_args(python, request), "--no-deps", "--no-build-isolation-package", "deepspeed"]
        wheels = self.cache_dir / "deepspeed-ops" / "wheels" / pair
        found: dict[str, object] = {"pair": pair, "prebuilt": []}
        try:
            cpu_s = self._uv(
                [*install, "--cache-dir", str(wheels), requirement("deepspeed", packages["deepspeed"])],
                log,
                extra_env=DEEPSPEED_NO_OPS,
            )
            found["cpu_s"] = round(cpu_s, 1) if cpu_s is not None else None
        except EnvironmentUnavailable as exc:
            found["why"] = exc.reason  # installed plainly by the main step
        found["seconds"] = round(time.perf_counter() - started, 1)
        return found


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        proc.wait()


def _read_both(proc: subprocess.Popen[bytes], deadline: float) -> tuple[bytes, bytes]:
    """Everything ``proc`` writes to its stdout and stderr until it closes both (``TimeoutExpired``
    past ``deadline``), read together so that neither pipe fills."""
    assert proc.stdout is not None and proc.stderr is not None
    out, err = proc.stdout.fileno(), proc.stderr.fileno()
    chunks: dict[int, list[bytes]] = {out: [], err: []}
    with selectors.DefaultSelector() as selector:
        selector.register(out, selectors.EVENT_READ)
        selector.register(err, selectors.EVENT_READ)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(proc.args, UV_TIMEOUT_S)
            for key, _ in selector.select(timeout=min(left, 60.0)):
                data = os.read(key.fd, 65536)
                if data:
                    chunks[key.fd].append(data)
                else:
                    selector.unregister(key.fd)
    proc.stdout.close()
    proc.stderr.close()
    return b"".join(chunks[out]), b"".join(chunks[err])


def _split(requirement: str) -> tuple[str, str]:
    """``deepspeed>=0.19`` -> ("deepspeed", ">=0.19"); a bare name asks for the newest."""
    match = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(.*)$", requirement)
    if not match:
        raise ValueError(f"not a requirement: {requirement!r}")
    return match[1].lower().replace("_", "-"), match[2].strip() or NEWEST


def write_excludes(directory: Path, packages: tuple[str, ...]) -> Path:
    """uv's ``--excludes`` file (one requirement name a line) for ``packages``, in ``directory``."""
    path = directory / EXCLUDES_FILE
    path.write_text("".join(f"{name}\n" for name in sorted(packages)), encoding="utf-8")
    return path


def python_identity(python: str) -> str:
    """The interpreter a venv was made from (its ``pyvenv.cfg`` home and version), else its path."""
    cfg = Path(python).parent.parent / "pyvenv.cfg"
    try:
        return " ".join(line.strip() for line in cfg.read_text().splitlines() if line.startswith(("home", "version")))
    except OSError:
        return str(Path(python).resolve())


def site_packages(python: str) -> Path | None:
    """The venv's ``site-packages`` (``python`` is ``<venv>/bin/python``)."""
    found = sorted(Path(python).parent.parent.glob("lib/python*/site-packages"))
    return found[0] if found else None


class UvProvider:
    """The default provider: one uv environment per distinct set of requirements, built once,
    reused by key, checked against its manifest before and after every item."""

    name: ClassVar[str] = "uv"
    installs_packages: ClassVar[bool] = True

    def __init__(self, context: ProviderContext | None = None, builder: UvEnvironments | None = None) -> None:
        if builder is None:
            if context is None:
                raise ValueError("a uv provider needs a context or a builder")
            builder = UvEnvironments(context.cache_dir, context.index(), max_gb=context.cache_max_gb)
        self.builder = builder

    def damage(self, env: Environment) -> list[str]:
        return self.builder.verify(env)

    def invalidate(self, env: Environment, reason: str) -> None:
        self.builder.invalidate(env, reason)

    def readiness(self, env: Environment) -> str:
        how = "reused" if env.reused else f"built in {env.build_s:.1f}s"
        if env.resolution is None or env.lock is None:
            return how
        when = f" as of {env.resolution['as_of']}" if env.resolution.get("as_of") else ""
        return f"{how}; its floating specs resolved{when} to {len(env.lock)} packages in {env.resolution['seconds']}s"

    @classmethod
    def rank_import_path(cls, env: Environment) -> list[str]:
        return []

    def lock_lines(self, cell: CellRequest) -> tuple[str, ...] | None:
        """What the cell's floating specs (or its day) resolve to now, as exact pins; None where the
        cell needs no resolving. A run whose nodes build the environments resolves once, here, so
        every node builds the same lock."""
        if cell.lock is not None:
            return cell.lock
        request = self._request(cell)
        if not request.floating and request.as_of is None:
            return None
        return self.builder.lock(request).lines

    def _request(self, cell: CellRequest) -> EnvRequest:
        return EnvRequest(
            packages=dict(cell.packages),
            python=cell.python,
            exclude_newer=cell.exclude_newer,
            exclude_packages=cell.exclude_packages,
            as_of=cell.as_of,
            prerelease=cell.prerelease,
        )

    def get(self, cell: CellRequest) -> Environment:
        """The cell's environment; a cell with floating specs is resolved to a lock first, and gets
        the environment of that lock (built the first time the lock is seen)."""
        request = self._request(cell)
        if cell.lock is not None:
            return self.builder.get(dataclasses.replace(request, lock=cell.lock), cell.name)
        if not request.floating and request.as_of is None:
            return self.builder.get(request, cell.name)
        # Floating specs, or a day to resolve the pins' dependencies as of: a lock first.
        lock = self.builder.lock(request)
        env = self.builder.get(dataclasses.replace(request, lock=lock.lines), cell.name)
        return dataclasses.replace(env, resolution=lock.describe())

    def release(self, env: Environment) -> None:
        self.builder.release(env.key)

    def cached(self, cell: CellRequest) -> bool:
        """Whether the cell's environment is built and ready (a floating cell cannot tell without
        resolving: False)."""
        request = self._request(cell)
        if cell.lock is not None:
            request = dataclasses.replace(request, lock=cell.lock)
        elif request.floating or request.as_of is not None:
            return False
        return (self.builder.env_dir(self.builder.key(request)) / READY_MARKER).exists()

    def cancel(self) -> None:
        self.builder.cancel()
