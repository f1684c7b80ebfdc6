"""An environment with DeepSpeed gets it without ops, from its (interpreter, torch) pair's own wheel
cache, and never compiles its CPU shm comm op at build: no item's training uses it (the ranks start
DeepSpeed's comm backend without it, ``repros/runtime/deepspeed_comm.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.environments import EnvRequest
from harness.environments import uv as uv_module
from harness.environments.inventory import Listing
from tests.environments.test_exclude_packages import RecordingBuilds

#: What a DeepSpeed release ships of the op: its builder and its sources (a build could compile them).
RELEASE = {
    "deepspeed/__init__.py": "",
    "deepspeed/git_version_info_installed.py": "installed_ops={'deepspeed_shm_comm': False}\n",
    "deepspeed/ops/op_builder/cpu/comm.py": "class ShareMemCommBuilder: ...\n",
    "deepspeed/ops/csrc/cpu/comm/shm.cpp": "// shm\n",
}


class Installs(RecordingBuilds):
    """Records each uv call's variables; an install of deepspeed lays out a release with the op."""

    def __init__(self, cache: Path, installed: dict[str, str]) -> None:
        super().__init__(cache, installed)
        self.environs: list[dict[str, str]] = []

    def _uv(self, args: list[str], log: Path, extra_env: dict[str, str] | None = None) -> None:
        self.environs.append(dict(extra_env or {}))
        super()._uv(args, log, extra_env)
        if any(a.startswith("deepspeed==") for a in args) and "--python" in args:
            site = Path(args[args.index("--python") + 1]).parent.parent / "lib/python3.11/site-packages"
            for rel, text in RELEASE.items():
                (site / rel).parent.mkdir(parents=True, exist_ok=True)
                (site / rel).write_text(text)


def test_deepspeed_is_installed_without_ops_and_its_comm_op_is_not_compiled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    installed = {"torch": "2.13.0+cpu", "deepspeed": "0.19.8"}
    monkeypatch.setattr(uv_module, "list_distributions", lambda python: Listing("3.11.7", dict(installed)))
    builds = Installs(tmp_path, installed)
    request = EnvRequest(packages={"torch": "==2.13.0", "deepspeed": "==0.19.8"}, python="3.11", exclude_newer=None)
    env = builds.get(request)
    deepspeed = [
        (call, environ)
        for call, environ in zip(builds.calls, builds.environs, strict=True)
        if "deepspeed==0.19.8" in call
    ]
    assert deepspeed, "deepspeed was never installed"
    assert all(not any(k.startswith("DS_BUILD_") and k != "DS_BUILD_OPS" for k in e) for _, e in deepspeed)
    (own_cache, without_ops), *_ = deepspeed
    assert without_ops == {"DS_BUILD_OPS": "0"} and "--no-deps" in own_cache
    pair = (env.deepspeed_ops or {}).get("pair")
    assert own_cache[own_cache.index("--cache-dir") + 1] == str(tmp_path / "deepspeed-ops" / "wheels" / str(pair))
    assert not (tmp_path / "deepspeed-ops" / "shm").exists()
