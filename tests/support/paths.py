"""Where the repository is, for tests that run commands in it, and a run's records as written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.records.results import read_results

REPO_ROOT = Path(__file__).resolve().parent.parent.parent


def results_json(path: Path) -> list[dict[str, Any]]:
    """A run's records as the file holds them (the on-disk contract), each validated on the way."""
    return [record.as_json() for record in read_results(path)]
