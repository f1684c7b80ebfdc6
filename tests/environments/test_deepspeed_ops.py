"""DeepSpeed's shm comm op built once per distinct build (``deepspeed_ops.py``): the key follows what
the compile reads, not the release; a shared build is placed into a DeepSpeed installed without ops
as DeepSpeed's own pre-built op; an environment build compiles the op only for a key not seen yet."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import pytest

from harness.environments import EnvRequest, UvEnvironments
from harness.environments import uv as uv_module
from harness.environments.deepspeed_ops import (
    SHM_OP,
    GraftFailed,
    built_op,
    graft,
    harvest,
    installed_ops,
    op_key,
)
from harness.environments.index import IndexConfig
from harness.environments.inventory import Listing

SO = f"{SHM_OP}_op.cpython-311-x86_64-linux-gnu.so"
PAIR = "pair-1"
GCC = "g++: g++ 12.2.0"


def fake_deepspeed(site: Path, version: str, shm_cpp: str = "// shm v1\n", builder: str = "# builder v1\n") -> Path:
    """A DeepSpeed as installed without ops: the op's sources and builders, the rest of a release."""
    package = site / "deepspeed"
    files = {
        "ops/csrc/cpu/comm/shm.cpp": shm_cpp,
        "ops/csrc/cpu/comm/shm_interface.cpp": "// interface\n",
        "ops/csrc/cpu/comm/x86_64/shm.h": "// x86\n",
        "ops/op_builder/builder.py": builder,
        "ops/op_builder/cpu/__init__.py": "",
        "ops/op_builder/cpu/builder.py": "class CPUOpBuilder: ...\n",
        "ops/op_builder/cpu/comm.py": "class ShareMemCommBuilder(CPUOpBuilder): ...\n",
        "accelerator/cpu_accelerator.py": "# cpu\n",
        "runtime/engine.py": f"# the engine of {version}\n",  # differs between releases; not read by the op
        "git_version_info_installed.py": (
            f"version='{version}'\n"
            f"installed_ops={{'async_io': False, '{SHM_OP}': False, 'cpu_adam': False}}\n"
            "accelerator_name='cpu'\n"
        ),
    }
    for name, text in files.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    info = site / f"deepspeed-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "RECORD").write_text(
        "deepspeed/git_version_info_installed.py,sha256=old,10\ndeepspeed/runtime/engine.py,,\n"
    )
    return site


def test_releases_with_the_same_op_sources_and_builders_share_a_key(tmp_path: Path) -> None:
    one = op_key(fake_deepspeed(tmp_path / "a", "0.17.6"), PAIR, GCC)
    other = op_key(fake_deepspeed(tmp_path / "b", "0.18.0"), PAIR, GCC)
    assert one is not None and one == other  # the engine differs, the op's inputs do not


@pytest.mark.parametrize(
    "change",
    ["source", "header", "builder", "pair", "compiler"],
)
def test_anything_the_compile_reads_changes_the_key(tmp_path: Path, change: str) -> None:
    base = op_key(fake_deepspeed(tmp_path / "a", "0.19.2"), PAIR, GCC)
    site = fake_deepspeed(
        tmp_path / "b",
        "0.19.2",
        shm_cpp="// shm v2\n" if change == "source" else "// shm v1\n",
        builder="# builder v2\n" if change == "builder" else "# builder v1\n",
    )
    if change == "header":
        (site / "deepspeed/ops/csrc/cpu/comm/x86_64/shm.h").write_text("// x86, changed\n")
    key = op_key(site, "pair-2" if change == "pair" else PAIR, "clang++: 18" if change == "compiler" else GCC)
    assert key is not None and key != base


def test_a_release_without_the_op_has_no_key(tmp_path: Path) -> None:
    site = fake_deepspeed(tmp_path, "0.9.0")
    (site / "deepspeed/ops/op_builder/cpu/comm.py").write_text("class CCLCommBuilder: ...\n")
    assert op_key(site, PAIR, GCC) is None
    assert op_key(tmp_path / "empty", PAIR, GCC) is None


def compiled(site: Path, payload: bytes = b"\x7fELF op") -> None:
    """What DeepSpeed's setup with ``DS_BUILD_SHM_COMM=1`` leaves: the module, and installed_ops saying so."""
    (site / "deepspeed/ops/comm").mkdir(parents=True, exist_ok=True)  # only where an op was built
    (site / "deepspeed/ops/comm" / SO).write_bytes(payload)
    info = site / "deepspeed/git_version_info_installed.py"
    info.write_text(info.read_text().replace(f"'{SHM_OP}': False", f"'{SHM_OP}': 1"))


def test_a_build_is_kept_whole_and_placed_as_deepspeeds_own_prebuilt_op(tmp_path: Path) -> None:
    first = fake_deepspeed(tmp_path / "a", "0.17.6")
    compiled(first)
    op_dir = tmp_path / "shm" / "k"
    assert [p.name for p in harvest(first, op_dir)] == [SO]
    assert not op_dir.with_name("k.partial").exists()

    second = fake_deepspeed(tmp_path / "b", "0.18.0")
    assert installed_ops(second) == []
    written = graft(second, op_dir)
    assert written == [f"deepspeed/ops/comm/{SO}"]
    assert (second / written[0]).read_bytes() == b"\x7fELF op"
    assert installed_ops(second) == [SHM_OP]
    info = (second / "deepspeed/git_version_info_installed.py").read_text()
    assert "'async_io': False" in info and "version='0.18.0'" in info  # only the op's entry changed
    record = (second / "deepspeed-0.18.0.dist-info/RECORD").read_text().splitlines()
    digest = base64.urlsafe_b64encode(hashlib.sha256(b"\x7fELF op").digest()).rstrip(b"=").decode()
    assert f"deepspeed/ops/comm/{SO},sha256={digest},7" in record
    assert sum(ln.startswith("deepspeed/git_version_info_installed.py,") for ln in record) == 1
    assert "deepspeed/git_version_info_installed.py,sha256=old,10" not in record


def test_an_unfinished_build_is_never_placed(tmp_path: Path) -> None:
    op_dir = tmp_path / "shm" / "k"
    op_dir.mkdir(parents=True)
    (op_dir / SO).write_bytes(b"half")  # no READY: a build that was interrupted
    assert built_op(op_dir) == []
    with pytest.raises(GraftFailed):
        graft(fake_deepspeed(tmp_path / "b", "0.18.0"), op_dir)


def test_a_deepspeed_that_does_not_name_the_op_is_left_alone(tmp_path: Path) -> None:
    first = fake_deepspeed(tmp_path / "a", "0.17.6")
    compiled(first)
    harvest(first, tmp_path / "shm" / "k")
    second = fake_deepspeed(tmp_path / "b", "0.18.0")
    info = second / "deepspeed/git_version_info_installed.py"
    info.write_text("version='0.18.0'\ninstalled_ops={'async_io': False}\n")
    with pytest.raises(GraftFailed):
        graft(second, tmp_path / "shm" / "k")
    assert not (second / "deepspeed/ops/comm" / SO).exists()


class FakeUv(UvEnvironments):
    """``_build`` for real, with uv replaced: an install of deepspeed lays out a fake release (its op
    sources those of ``SOURCES[version]``); one with ``DS_BUILD_SHM_COMM=1`` also compiles the op."""

    SOURCES = {"0.17.6": "// shm v1\n", "0.18.0": "// shm v1\n", "0.19.2": "// shm v2\n"}

    def __init__(self, cache: Path) -> None:
        super().__init__(cache, IndexConfig(), uv="uv-not-called")
        self.op_builds: list[str] = []

    def uv_version(self) -> str:
        return "uv 0.0.0"

    def find_python(self, request: str) -> tuple[str, str]:
        return (f"/usr/bin/python{request}", f"{request}.7")

    def op_build_environ(self, python: str) -> tuple[dict[str, str], str]:
        return {**uv_module.DEEPSPEED_PREBUILT_OPS}, GCC

    def _uv(self, args: list[str], log: Path, extra_env: dict[str, str] | None = None) -> None:
        if args[0] == "venv":
            python = Path(args[-1]) / "bin" / "python"
            python.parent.mkdir(parents=True)
            python.write_text("#!/bin/sh\n")
            python.chmod(0o755)
            (Path(args[-1]) / "lib/python3.11/site-packages").mkdir(parents=True)
            (Path(args[-1]) / "pyvenv.cfg").write_text("home = /usr/bin\nversion_info = 3.11.7\n")
            return
        wanted = [a for a in args if a.startswith("deepspeed==")]
        if not wanted or "--no-deps" not in args:
            return
        version = wanted[0].split("==")[1]
        python = args[args.index("--python") + 1]
        site = Path(python).parent.parent / "lib/python3.11/site-packages"
        fake_deepspeed(site, version, shm_cpp=self.SOURCES[version])
        if (extra_env or {}).get("DS_BUILD_SHM_COMM") == "1":
            self.op_builds.append(version)
            compiled(site, payload=f"op of {self.SOURCES[version]}".encode())


@pytest.fixture
def inventory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(uv_module, "list_distributions", lambda python: Listing("3.11.7", {"torch": "2.13.0+cpu"}))


def request(version: str) -> EnvRequest:
    return EnvRequest(packages={"torch": "==2.13.0", "deepspeed": f"=={version}"}, python="3.11", exclude_newer=None)


def test_the_op_is_compiled_once_per_distinct_build_not_per_release(tmp_path: Path, inventory: None) -> None:
    builds = FakeUv(tmp_path)
    envs = {v: builds.get(request(v)) for v in ("0.17.6", "0.18.0", "0.19.2")}
    assert builds.op_builds == ["0.17.6", "0.19.2"]  # 0.18.0 has 0.17.6's sources: no compile
    steps = {v: env.deepspeed_ops or {} for v, env in envs.items()}
    assert steps["0.17.6"]["op"] == "built" and steps["0.19.2"]["op"] == "built"
    assert steps["0.18.0"]["op"] == "shared" and steps["0.18.0"]["op_key"] == steps["0.17.6"]["op_key"]
    assert steps["0.19.2"]["op_key"] != steps["0.17.6"]["op_key"]
    for version, env in envs.items():
        site = Path(env.python).parent.parent / "lib/python3.11/site-packages"
        assert installed_ops(site) == [SHM_OP]
        assert (site / "deepspeed/ops/comm" / SO).read_bytes() == f"op of {FakeUv.SOURCES[version]}".encode()
        assert steps[version]["prebuilt"] == [SHM_OP]
