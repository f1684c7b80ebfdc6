"""The orchestrator never imports torch: it reads repro specs without the heavy stack."""

from __future__ import annotations

import subprocess
import sys

from tests.paths import REPO_ROOT

PROBE = """
import sys
import harness.cli, harness.pipeline, harness.pytest_plugin
from harness.repro_registry import discover
found = discover()
assert found.repros, "no repros discovered"
assert not found.broken, found.broken
heavy = sorted(m for m in ("torch", "deepspeed", "transformers", "peft", "bitsandbytes") if m in sys.modules)
print(",".join(heavy))
"""


def test_discovering_repros_imports_no_heavy_package() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=REPO_ROOT, check=True)
    assert out.stdout.strip() == ""
