"""Fixtures the environment tests share."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.environments import cache as cache_module
from harness.environments import integrity as integrity_module
from harness.environments import seals as seals_module
from harness.environments.integrity import digest_of


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every file read to hash it, wherever the harness hashes."""
    seen: list[str] = []

    def counting(path: str | Path) -> str:
        seen.append(str(path))
        return digest_of(path)

    for module in (cache_module, integrity_module, seals_module):
        monkeypatch.setattr(module, "digest_of", counting)
    return seen
