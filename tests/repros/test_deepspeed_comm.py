"""DeepSpeed's CPU shm comm op is left unbuilt in the ranks (``repros/runtime/deepspeed_comm.py``):
DeepSpeed's comm backend starts without compiling it, whether DeepSpeed is imported before (a cell's
pre-imported worker) or after (a rank torchrun started); ``FT_REGRESS_DEEPSPEED_SHM_COMM=build``
leaves DeepSpeed to build and load it as it would; the rank's record says which."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from repros.runtime.deepspeed_comm import LEFT_UNBUILT, LOADED, SWITCH
from tests.support.paths import REPO_ROOT

#: A stand-in for ``deepspeed/comm/torch.py``: its backend calls ``build_shm_op`` as DeepSpeed's does,
#: and the "compile" leaves a mark on disk.
COMM_TORCH = """
import os
def build_shm_op():
    open(os.environ["COMPILED_MARK"], "a").write("compiled\\n")
    return "the op"

class TorchBackend:
    def __init__(self):
        self.shm_comm_op = build_shm_op()
"""

RANK = """
import json, sys
from repros.runtime.deepspeed_comm import leave_unbuilt, recorded
if sys.argv[1] == "before":
    import deepspeed.comm.torch
leave_unbuilt()
from deepspeed.comm.torch import TorchBackend
backend = TorchBackend()
print(json.dumps({"op": backend.shm_comm_op, "record": recorded()}))
"""


@pytest.fixture
def fake_deepspeed(tmp_path: Path) -> Path:
    comm = tmp_path / "site" / "deepspeed" / "comm"
    comm.mkdir(parents=True)
    (comm.parent / "__init__.py").write_text("")
    (comm / "__init__.py").write_text("")
    (comm / "torch.py").write_text(COMM_TORCH)
    return tmp_path


def start_backend(where: Path, imported: str, build: bool) -> tuple[dict[str, object], bool]:
    mark = where / "compiled"
    environ = {**os.environ, "PYTHONPATH": f"{where / 'site'}{os.pathsep}{REPO_ROOT}", "COMPILED_MARK": str(mark)}
    environ.pop(SWITCH, None)
    if build:
        environ[SWITCH] = "build"
    done = subprocess.run(
        [sys.executable, "-c", RANK, imported], env=environ, capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1]), mark.exists()


@pytest.mark.parametrize("imported", ["before", "after"])
def test_deepspeeds_comm_backend_starts_without_building_the_op_and_the_record_says_so(
    fake_deepspeed: Path, imported: str
) -> None:
    seen, compiled = start_backend(fake_deepspeed, imported, build=False)
    assert not compiled
    assert seen == {"op": None, "record": {"deepspeed_shm_comm": LEFT_UNBUILT}}


def test_asked_for_the_op_deepspeed_builds_and_loads_it(fake_deepspeed: Path) -> None:
    seen, compiled = start_backend(fake_deepspeed, "after", build=True)
    assert compiled
    assert seen == {"op": "the op", "record": {"deepspeed_shm_comm": LOADED}}
