"""A package that fails half-way through the cell server's preload meets its ranks as it meets a user.

DeepSpeed 0.16.3 with triton 3.2 does not import on a CPU (triton: "0 active drivers"). The server's failed
preload used to leave the submodules that had finished in place, so every forked rank importing DeepSpeed
again met a circular ``ImportError`` of the harness's making instead of triton's error. The package below
has DeepSpeed's shape: a package whose ``__init__`` imports a layer that imports a sibling submodule, and a
kernel that raises as it is imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.paths import REPO_ROOT

PACKAGE = {
    "halfds/__init__.py": "from . import ops\n",
    "halfds/ops/__init__.py": "from . import transformer\n",
    "halfds/ops/transformer/__init__.py": "from .inference.config import Config\nfrom ...impl.layer import Layer\n",
    "halfds/ops/transformer/inference/__init__.py": "from ....impl.layer import Layer\n",
    "halfds/ops/transformer/inference/config.py": "Config = object\n",
    "halfds/ops/transformer/inference/kernel.py": "raise RuntimeError('0 active drivers ([]).')\n",
    "halfds/impl/__init__.py": "",
    "halfds/impl/layer.py": (
        "from halfds.ops.transformer.inference.config import Config\n"
        "from halfds.ops.transformer.inference.kernel import K\n"
        "class Layer: pass\n"
    ),
}

# What the server does (preload), then what a forked rank does (import the package again).
SERVER_THEN_RANK = textwrap.dedent(
    """
    import importlib, json, sys
    from repros.runtime.cell_server import preload
    took, failed, deferred = preload(["halfds"])
    try:
        importlib.import_module("halfds")
        again = "imported"
    except Exception as exc:
        again = f"{type(exc).__name__}: {exc}"
    print(json.dumps({"preload": failed.get("halfds"), "rank": again}))
    """
)


def test_a_rank_meets_the_error_a_fresh_import_meets_after_the_preload_failed_half_way(tmp_path: Path) -> None:
    for name, text in PACKAGE.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    fresh = subprocess.run(
        [sys.executable, "-c", "import halfds"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert "RuntimeError: 0 active drivers" in fresh.stderr
    done = subprocess.run(
        [sys.executable, "-c", SERVER_THEN_RANK],
        cwd=tmp_path,
        env={"PYTHONPATH": f"{tmp_path}:{REPO_ROOT}", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["preload"].startswith("RuntimeError: 0 active drivers")
    assert seen["rank"].startswith("RuntimeError: 0 active drivers"), seen["rank"]
