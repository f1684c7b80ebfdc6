"""The orchestrator never imports torch: every one of its modules (and of the project's benchmarks,
which run in its process) imports, and discovers the repros' specs, without any heavy package of a
cell."""

from __future__ import annotations

import subprocess
import sys

from tests.support.paths import REPO_ROOT

PROBE = """
import importlib, pkgutil, sys
import benchmarks, harness
for package in (harness, benchmarks):
    for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if module.name != "harness.__main__":
            importlib.import_module(module.name)
from harness.config.repros import discover
found = discover()
assert found.repros, "no repros discovered"
assert not found.broken, found.broken
HEAVY = ("torch", "deepspeed", "transformers", "peft", "bitsandbytes", "accelerate")
heavy = sorted(m for m in HEAVY if m in sys.modules)
print(",".join(heavy))
"""


def test_importing_every_orchestrator_module_imports_no_heavy_package() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=REPO_ROOT, check=True)
    assert out.stdout.strip() == ""
