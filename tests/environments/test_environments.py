"""Environment keys, reuse, interrupted builds, and pip's index configuration for uv."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

import pytest

from harness.environments import Environment, EnvironmentUnavailable, EnvRequest, UvEnvironments
from harness.environments.index import IndexConfig, parse_pip_config_list
from harness.environments.uv import READY_MARKER, extensions_dir_for

PIP_CONFIG_LIST = """\
:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.find-links='/opt/wheels'
global.cert='/etc/ssl/certs/ca-certificates.crt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/old-wheels'
"""

REQUEST = EnvRequest(packages={"torch": "==2.13.0", "deepspeed": "==0.19.2"}, python="3.11", exclude_newer=None)


class FakeBuilds(UvEnvironments):
    """Real keying and reuse logic; the uv calls replaced by a recorded fake build."""

    def __init__(self, cache: Path, index: IndexConfig | None = None, fail_with: BaseException | None = None) -> None:
        super().__init__(cache, index or IndexConfig(), uv="uv-not-called")
        self.builds = 0
        self.fail_with = fail_with

    def uv_version(self) -> str:
        return "uv 0.0.0"

    def find_python(self, request: str) -> tuple[str, str]:
        return (f"/usr/bin/python{request}", f"{request}.7")

    def _build(self, request: EnvRequest, key: str, env_dir: Path) -> Environment:
        self.builds += 1
        env_dir.mkdir(parents=True)
        (env_dir / "venv" / "bin").mkdir(parents=True)
        site = env_dir / "venv" / "lib" / "python3.11" / "site-packages" / "peft"
        site.mkdir(parents=True)
        (site / "__init__.py").write_text("__version__ = '0.21.2'\n")
        (env_dir / "venv" / "bin" / "python").write_text("#!/bin/sh\n")
        (env_dir / "venv" / "bin" / "python").chmod(0o755)
        if self.fail_with is not None:
            raise self.fail_with
        return Environment(
            key=key,
            python=str(env_dir / "venv/bin/python"),
            python_version="3.11.7",
            packages={"torch": "2.13.0", "deepspeed": "0.19.2"},
            path=str(env_dir),
            extensions_dir=str(extensions_dir_for(env_dir)),
            reused=False,
            build_s=0.0,
        )


def test_pip_config_becomes_uv_arguments_with_the_environment_winning() -> None:
    config = parse_pip_config_list(PIP_CONFIG_LIST)
    assert config.find_links == ("/opt/wheels",)
    assert config.extra_index_urls == ("file:///opt/pypi/simple", "file:///opt/pypi-more/simple")
    args = config.uv_args()
    assert args[args.index("--find-links") + 1] == "/opt/wheels"
    assert args.count("--extra-index-url") == 2
    assert args[args.index("--index-strategy") + 1] == "unsafe-best-match"


def test_key_is_stable_and_ignores_package_order(tmp_path: Path) -> None:
    builds = FakeBuilds(tmp_path)
    reordered = EnvRequest(packages={"deepspeed": "==0.19.2", "torch": "==2.13.0"}, python="3.11", exclude_newer=None)
    assert builds.key(REQUEST) == builds.key(reordered)


@pytest.mark.parametrize(
    "change",
    [
        {"packages": {"torch": "==2.13.0", "deepspeed": "==0.19.8"}},
        {"packages": {"torch": "==2.13.0", "deepspeed": "==0.19.2", "peft": "==0.21.2"}},
        {"python": "3.12"},
        {"exclude_newer": "2026-06-30"},
    ],
)
def test_key_changes_with_what_changes_the_install(tmp_path: Path, change: dict) -> None:
    builds = FakeBuilds(tmp_path)
    assert builds.key(REQUEST) != builds.key(dataclasses.replace(REQUEST, **change))


def test_key_changes_with_the_indexes_in_force(tmp_path: Path) -> None:
    plain = FakeBuilds(tmp_path).key(REQUEST)
    with_links = FakeBuilds(tmp_path, IndexConfig(find_links=("/opt/wheels",))).key(REQUEST)
    with_index = FakeBuilds(tmp_path, IndexConfig(index_url="https://mirror.invalid/simple")).key(REQUEST)
    assert len({plain, with_links, with_index}) == 3


def test_environment_is_built_once_then_reused(tmp_path: Path) -> None:
    builds = FakeBuilds(tmp_path)
    first = builds.get(REQUEST)
    second = builds.get(REQUEST)
    assert builds.builds == 1
    assert not first.reused and second.reused
    assert second.python == first.python
    other = builds.get(dataclasses.replace(REQUEST, python="3.12"))
    assert builds.builds == 2 and other.key != first.key and other.path != first.path


def test_a_failed_build_leaves_nothing_to_reuse(tmp_path: Path) -> None:
    failing = FakeBuilds(tmp_path, fail_with=EnvironmentUnavailable("No solution found"))
    with pytest.raises(EnvironmentUnavailable):
        failing.get(REQUEST)
    assert not failing.env_dir(failing.key(REQUEST)).exists()


def test_an_interrupted_build_is_rebuilt_not_reused(tmp_path: Path) -> None:
    builds = FakeBuilds(tmp_path)
    key = builds.key(REQUEST)
    half = builds.env_dir(key)
    (half / "venv" / "bin").mkdir(parents=True)  # what a build killed halfway leaves: no READY marker
    env = builds.get(REQUEST)
    assert builds.builds == 1 and not env.reused
    assert (half / READY_MARKER).exists()


def test_keyboard_interrupt_during_a_build_is_cleaned_up(tmp_path: Path) -> None:
    interrupted = FakeBuilds(tmp_path, fail_with=KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        interrupted.get(REQUEST)
    assert not interrupted.env_dir(interrupted.key(REQUEST)).exists()


def test_each_environment_compiles_its_ops_in_a_directory_of_its_own(tmp_path: Path) -> None:
    builds = FakeBuilds(tmp_path)
    a = builds.get(REQUEST)
    b = builds.get(dataclasses.replace(REQUEST, packages={**REQUEST.packages, "peft": "==0.21.2"}))
    assert a.extensions_dir != b.extensions_dir
    assert Path(a.extensions_dir).parent == Path(a.path)
    assert builds.get(REQUEST).extensions_dir == a.extensions_dir  # reused with the environment


class SlowCountingBuilds(FakeBuilds):
    """A build that takes a while and counts itself in a file shared across processes."""

    def _build(self, request: EnvRequest, key: str, env_dir: Path) -> Environment:
        with open(self.cache_dir / "builds.log", "a") as fh:
            fh.write(f"{os.getpid()}\n")
        time.sleep(1.0)
        return super()._build(request, key, env_dir)


def _get_in_child(cache: str, result: Any) -> None:
    result.put(SlowCountingBuilds(Path(cache)).get(REQUEST).python)


def test_two_runs_sharing_a_cache_build_an_environment_once(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    children = [context.Process(target=_get_in_child, args=(str(tmp_path), results)) for _ in range(2)]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=60)
        assert child.exitcode == 0
    pythons = {results.get(timeout=5), results.get(timeout=5)}
    assert len(pythons) == 1
    assert (tmp_path / "builds.log").read_text().count("\n") == 1


def site_file(env: Environment) -> Path:
    return Path(env.python).parent.parent / "lib" / "python3.11" / "site-packages" / "peft" / "__init__.py"


def test_a_damaged_cached_environment_is_rebuilt_once_and_says_why(tmp_path: Path) -> None:
    builds = FakeBuilds(tmp_path)
    first = builds.get(REQUEST)
    assert builds.verify(first) == [] and builds.get(REQUEST).reused
    with open(site_file(first), "a") as fh:  # what a repro that edits site-packages does
        fh.write("raise RuntimeError('patched')\n")
    assert [f"{site_file(first)} was modified (size 23 is now 53)"] == builds.verify(first)
    again = builds.get(REQUEST)
    assert builds.builds == 2 and not again.reused
    assert again.repaired and "was modified" in again.repaired and str(site_file(first)) in again.repaired
    assert "patched" not in site_file(again).read_text() and builds.get(REQUEST).reused


@pytest.mark.parametrize(
    "damage",
    [
        lambda env_dir, env: Path(env.python).unlink(),
        lambda env_dir, env: (env_dir / "env.json").write_text("{not json"),
        lambda env_dir, env: (env_dir / "env.json").unlink(),
        lambda env_dir, env: (env_dir / "env.json").write_text("[1, 2]"),
        lambda env_dir, env: (env_dir / "manifest.json").unlink(),
        lambda env_dir, env: (Path(env.python).parent / "sitecustomize.py").write_text("import os\n"),
    ],
    ids=["python deleted", "env.json garbage", "env.json missing", "env.json a list", "no manifest", "file added"],
)
def test_every_kind_of_damage_is_detected_and_rebuilt(tmp_path: Path, damage: Any) -> None:
    builds = FakeBuilds(tmp_path)
    first = builds.get(REQUEST)
    damage(Path(first.path), first)
    again = builds.get(REQUEST)
    assert builds.builds == 2 and again.repaired


def test_a_field_written_by_a_newer_checkout_is_not_damage(tmp_path: Path) -> None:
    builds = FakeBuilds(tmp_path)
    first = builds.get(REQUEST)
    record = json.loads((Path(first.path) / "env.json").read_text())
    (Path(first.path) / "env.json").write_text(json.dumps({**record, "written_by_a_newer_checkout": 1}))
    assert builds.get(REQUEST).reused and builds.builds == 1


def test_a_damaged_environment_whose_rebuild_fails_is_unavailable_with_both_reasons(tmp_path: Path) -> None:
    builds = FakeBuilds(tmp_path)
    first = builds.get(REQUEST)
    Path(first.python).unlink()
    builds.fail_with = EnvironmentUnavailable("No solution found when resolving")
    with pytest.raises(EnvironmentUnavailable) as info:
        builds.get(REQUEST)
    assert "venv/bin/python was removed" in info.value.reason and "No solution found" in info.value.reason


def test_an_invalidated_environment_is_rebuilt_by_the_next_run(tmp_path: Path) -> None:
    builds = FakeBuilds(tmp_path)
    first = builds.get(REQUEST)
    builds.invalidate(first, "changed while an item ran")
    assert (Path(first.path) / "DAMAGED").read_text().startswith("changed while an item ran")
    assert not builds.get(REQUEST).reused and builds.builds == 2


def test_one_cells_broken_environment_leaves_the_others_ready(tmp_path: Path) -> None:
    from harness.config.model import Cell
    from harness.environments import Environments
    from harness.environments.uv import UvProvider

    builds = FakeBuilds(tmp_path)  # real keying, reuse and damage checks; no uv
    envs = Environments(tmp_path, IndexConfig(), providers={"uv": UvProvider(builder=builds)})

    def cell(name: str, peft: str) -> Cell:
        packages = {**REQUEST.packages, "peft": peft}
        return Cell(
            name=name,
            packages=packages,
            lanes=("ci",),
            world_size=2,
            python="3.11",
            timeout_s=60.0,
            exclude_newer=None,
            provider="uv",
            repros=None,
        )

    good, bad = cell("good", "==0.21.2"), cell("bad", "==0.21.1")
    broken = envs.uv.get(EnvRequest(bad.packages, "3.11", None))
    Path(broken.python).unlink()
    builds.fail_with = PermissionError(13, "Permission denied", str(tmp_path))  # the rebuild cannot write
    answer = envs.for_cell(bad)
    assert answer.env is None and "PermissionError" in answer.reason
    builds.fail_with = None
    assert envs.for_cell(good).env is not None


def _stand_in_uv(tmp_path: Path, body: str) -> str:
    uv = tmp_path / "uv"
    uv.write_text(f"#!/bin/sh\n{body}\n")
    uv.chmod(0o755)
    return str(uv)


def test_an_installer_stopped_by_a_signal_says_so_and_claims_no_missing_python(tmp_path: Path) -> None:
    # A cancelled Slurm job's SIGTERM reaches uv as it looks for the interpreter: that says nothing
    # about the machine's Pythons, and the reason must not read as if it did.
    builds = UvEnvironments(tmp_path / "cache", IndexConfig(), uv=_stand_in_uv(tmp_path, "kill -TERM $$"))
    with pytest.raises(EnvironmentUnavailable) as stopped:
        builds.find_python("3.11")
    assert "stopped by SIGTERM" in stopped.value.reason
    assert "no Python" not in stopped.value.reason


def test_an_installer_that_fails_on_its_own_keeps_its_words(tmp_path: Path) -> None:
    said = "error: No interpreter found for Python 3.11 in virtual environments"
    uv = _stand_in_uv(tmp_path, f"echo '{said}' >&2; exit 2")
    with pytest.raises(EnvironmentUnavailable) as missing:
        UvEnvironments(tmp_path / "cache", IndexConfig(), uv=uv).find_python("3.11")
    assert missing.value.reason == f"no Python 3.11 on this machine: {said}"
