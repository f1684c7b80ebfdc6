"""What an interpreter has installed, read by the interpreter itself (standard library only)."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass

from harness.core.processes import isolated_environ

_LIST_DISTRIBUTIONS = (
    "import json, sys\n"
    "from importlib import metadata\n"
    "d = {}\n"
    "for dist in metadata.distributions():\n"
    "    name = (dist.metadata['Name'] or '').lower().replace('_', '-')\n"
    "    if name: d[name] = dist.version\n"
    "print(json.dumps({'python': '.'.join(map(str, sys.version_info[:3])), 'packages': d}))\n"
)


@dataclass(frozen=True)
class Listing:
    python_version: str
    packages: dict[str, str]


def list_distributions(python: str, timeout_s: float = 120.0, isolated: bool = True) -> Listing:
    """The interpreter's version and every distribution installed for it (no imports beyond the
    stdlib). ``isolated``: as a cell's ranks see it, without the caller's ``PYTHONPATH``."""
    out = subprocess.run(
        [python, "-c", _LIST_DISTRIBUTIONS],
        capture_output=True,
        text=True,
        check=True,
        timeout=timeout_s,
        env=isolated_environ() if isolated else None,
    )
    data = json.loads(out.stdout)
    return Listing(python_version=str(data["python"]), packages=dict(data["packages"]))
