"""Where a run ran and what ran it: the machine's CPU and GPUs, read without importing torch, and the
harness's own commit."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

from harness.core.json import JsonObject


def cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def gpus() -> list[dict[str, str]]:
    """Each GPU's name, driver and memory as nvidia-smi reports them (none without it)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        out = subprocess.run(
            [smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    found = []
    for line in out.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3:
            found.append({"name": parts[0], "driver": parts[1], "memory": parts[2]})
    return found


def host_info() -> JsonObject:
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_model": cpu_model(),
        "cpus": os.cpu_count(),
        "gpus": gpus(),
        "python": sys.version.split()[0],
    }


#: The checkout the harness runs from, where it does (its ``git`` commit).
CHECKOUT = Path(__file__).resolve().parents[2]


def git_commit() -> str | None:
    """The harness's own commit, where it runs from a checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=CHECKOUT, capture_output=True, text=True, check=False)
    except OSError:
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None
