"""The environment cache's budget: floating nights each build an environment, the least recently
used are evicted to stay under the budget, one in use (held by another process) is never touched,
files environments hold in common are stored once, and a full disk is said as such."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.environments import EnvironmentUnavailable, EnvRequest
from harness.environments import uv as uv_module
from harness.environments.cache import (
    GB,
    STORE,
    budget_bytes,
    cache_bytes,
    disk_full_reason,
    entries,
    evict_to_fit,
    in_use,
    is_disk_full,
)
from harness.environments.integrity import damage
from harness.environments.inventory import Listing
from tests.environments.test_floating import KeyOnly

MIB = 1024 * 1024
#: What every night's environment holds in common (a torch build) and what only it holds.
COMMON = os.urandom(MIB)


class FakeBuilds(KeyOnly):
    """The real ``get`` (eviction, sharing, manifest) with uv replaced: each build writes 1 MiB
    shared by every night and 1 MiB of its own."""

    def __init__(self, cache: Path, max_gb: float) -> None:
        super().__init__(cache)
        self.max_gb = max_gb

    def _uv(self, args: list[str], log: Path, extra_env: dict[str, str] | None = None) -> None:
        if args[0] == "venv":
            venv = Path(args[-1])
            (venv / "bin").mkdir(parents=True)
            (venv / "bin" / "python").write_text("#!/bin/sh\n")
            (venv / "bin" / "python").chmod(0o755)
            site = venv / "lib" / "site-packages"
            site.mkdir(parents=True)
            (site / "torch.so").write_bytes(COMMON)
            (site / "own.bin").write_bytes(os.urandom(MIB))


@pytest.fixture
def fake_inventory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(uv_module, "list_distributions", lambda python: Listing("3.11.7", {"peft": "0.15.2"}))


def night(n: int) -> EnvRequest:
    """The floating cell resolved on night ``n``: a new peft each night, a new environment."""
    return EnvRequest(
        packages={"peft": "*"}, python="3.11", exclude_newer=None, lock=(f"peft==0.15.{n}", "torch==2.13.0")
    )


def holder(cache: Path, key: str) -> subprocess.Popen[str]:
    """Another process using the environment ``key`` (a run of its own), until killed."""
    code = (
        "import sys, time; from pathlib import Path; from harness.environments.cache import Holds; "
        f"holds = Holds(Path({str(cache)!r})); holds.hold({key!r}); print('held', flush=True); time.sleep(600)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_floating_nights_stay_under_the_budget_and_an_environment_in_use_survives(
    tmp_path: Path, fake_inventory: None
) -> None:
    cache = tmp_path / "cache"
    budget_mib = 5
    first_key = FakeBuilds(cache, budget_mib * MIB / GB).key(night(0))
    other = holder(cache, first_key)
    try:
        sizes = []
        for n in range(8):
            # Each night is a new process: it holds only what it uses.
            builds = FakeBuilds(cache, budget_mib * MIB / GB)
            env = builds.get(night(n), cell="latest")
            assert Path(str(env.path)).is_dir()
            sizes.append(cache_bytes(cache))
            assert sizes[-1] <= budget_mib * MIB, f"night {n}: {sizes[-1] / MIB:.1f} MiB over the budget"
            builds.holds.release(builds.key(night(n)))
            time.sleep(1.1)  # last use is kept to the second
        keys = {e.key for e in entries(cache)}
        # The environment in use was never touched; the most recent nights are kept, the oldest went.
        assert first_key in keys and in_use(cache, first_key)
        assert FakeBuilds(cache, 1).key(night(7)) in keys
        assert FakeBuilds(cache, 1).key(night(1)) not in keys
        assert damage(cache / "envs" / first_key) == []
        # Shared: the common 1 MiB is on disk once, however many environments hold it.
        assert len(list((cache / STORE).rglob("*"))) >= 1
        assert all(e.cells == ["latest"] for e in entries(cache))
    finally:
        other.kill()
        other.wait()
    # Once nobody holds it, the oldest goes first.
    done = evict_to_fit(cache, budget=3 * MIB)
    assert first_key in {e.key for e in done.removed} and done.after_bytes <= 3 * MIB


def test_shared_files_are_stored_once_and_an_edit_in_place_is_damage_everywhere(
    tmp_path: Path, fake_inventory: None
) -> None:
    cache = tmp_path / "cache"
    builds = FakeBuilds(cache, 1.0)
    envs = [builds.get(night(n)) for n in range(3)]
    # 3 environments of 2 MiB each: the common MiB once, 3 of their own.
    assert cache_bytes(cache) < 4.5 * MIB
    shared = Path(str(envs[0].path)) / "venv" / "lib" / "site-packages" / "torch.so"
    assert shared.stat().st_nlink == 4  # three environments and the store
    with open(shared, "r+b") as fh:  # one environment's file edited in place
        fh.write(b"x")
    for env in envs:
        assert any("torch.so" in problem for problem in damage(Path(str(env.path))))


def test_the_default_budget_is_half_of_what_the_cache_could_have(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FT_REGRESS_CACHE_MAX_GB", raising=False)
    import shutil

    free = shutil.disk_usage(tmp_path).free
    assert abs(budget_bytes(tmp_path / "c") - free / 2) < 64 * MIB
    assert budget_bytes(tmp_path / "c", 2.5) == int(2.5 * GB)
    monkeypatch.setenv("FT_REGRESS_CACHE_MAX_GB", "7")
    assert budget_bytes(tmp_path / "c") == 7 * GB


def test_a_full_disk_is_reported_as_a_full_disk(tmp_path: Path, fake_inventory: None) -> None:
    class FullDisk(FakeBuilds):
        def _uv(self, args: list[str], log: Path, extra_env: dict[str, str] | None = None) -> None:
            raise EnvironmentUnavailable(
                "error: Failed to install: torch", log="error: failed to write: No space left on device (os error 28)"
            )

    with pytest.raises(EnvironmentUnavailable) as info:
        FullDisk(tmp_path / "cache", 1.0).get(night(0))
    assert info.value.reason.startswith("the disk is full:") and "ft-regress cache prune" in info.value.reason
    assert is_disk_full("OSError: [Errno 28] No space left on device") and not is_disk_full("No solution found")
    assert "GB free" in disk_full_reason(tmp_path / "nowhere")


def test_the_cache_verb_lists_and_prunes(tmp_path: Path, fake_inventory: None) -> None:
    cache = tmp_path / "cache"
    builds = FakeBuilds(cache, 1.0)
    for n in range(3):
        builds.get(dataclasses.replace(night(n)), cell=f"night-{n}")
        time.sleep(1.1)
    for n in range(3):
        builds.holds.release(builds.key(night(n)))
    listed = subprocess.run(
        [sys.executable, "-m", "harness", "cache", "--cache-dir", str(cache)], capture_output=True, text=True
    )
    assert listed.returncode == 0 and "3 environments" in listed.stdout and "night-2" in listed.stdout
    pruned = subprocess.run(
        [sys.executable, "-m", "harness", "cache", "prune", "--cache-dir", str(cache), "--max-gb", str(3 * MIB / GB)],
        capture_output=True,
        text=True,
    )
    assert pruned.returncode == 0, pruned.stdout + pruned.stderr
    assert [e.cells for e in entries(cache)] == [["night-2"]]


def test_an_eviction_racing_a_reuse_never_removes_the_environment_it_hands_out(
    tmp_path: Path, fake_inventory: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another run evicts (the whole cache over its budget) in the very moment this run has found the
    environment whole and is about to use it: the environment survives, held, and is what ``get`` returns."""
    cache = tmp_path / "cache"
    FakeBuilds(cache, 1).get(night(0), cell="latest")  # built by an earlier run, which has ended
    reuse = FakeBuilds(cache, 1)
    original = uv_module.UvEnvironments._reusable
    evictions = []

    def checked_then_evicted(self: uv_module.UvEnvironments, env_dir: Path) -> tuple[object, str]:
        found = original(self, env_dir)
        evictions.append(
            subprocess.run(  # another run's eviction: a process of its own
                [
                    sys.executable,
                    "-c",
                    f"from pathlib import Path; from harness.environments.cache import evict_to_fit; "
                    f"print(len(evict_to_fit(Path({str(cache)!r}), budget=0).removed))",
                ],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        )
        return found

    monkeypatch.setattr(uv_module.UvEnvironments, "_reusable", checked_then_evicted)
    env = reuse.get(night(0), cell="latest")
    assert evictions == ["0"], "the other run removed an environment this one was handing out"
    assert Path(str(env.path)).is_dir() and Path(env.python).exists()
    assert in_use(cache, reuse.key(night(0)))


def test_a_hold_waiting_on_an_eviction_is_taken_on_the_lock_file_that_stays(tmp_path: Path) -> None:
    """An evictor unlinks an environment's in-use file while it holds it: a hold granted on the
    unlinked file would protect nothing, so it is taken again on the current one."""
    import fcntl

    from harness.environments.cache import Holds

    cache = tmp_path / "cache"
    lock = cache / "envs" / "k.inuse"
    lock.parent.mkdir(parents=True)
    evictor = open(lock, "a")  # noqa: SIM115
    fcntl.flock(evictor, fcntl.LOCK_EX)
    code = (
        "from pathlib import Path; from harness.environments.cache import Holds; "
        f"h = Holds(Path({str(cache)!r})); h.hold('k'); print('held', flush=True); import time; time.sleep(600)"
    )
    waiter = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(1.0)  # the waiter is blocked on the evictor's lock
        lock.unlink()
        evictor.close()
        assert waiter.stdout is not None and waiter.stdout.readline().strip() == "held"
        assert lock.exists() and in_use(cache, "k"), "the hold is on a file nobody else can see"
    finally:
        waiter.kill()
        waiter.wait()
    assert not in_use(cache, "k")
    Holds(cache).hold("k")
