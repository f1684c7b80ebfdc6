"""Where packages come from: pip's configured find-links and indexes, handed to uv.

uv ignores pip's configuration files and ``PIP_*`` variables, so a machine whose
pip points at a local wheel folder or a mirror would silently get other wheels
from uv. This reads what ``pip config list`` reports (files and environment) and
turns it into uv arguments. The same facts go into each environment's key.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from dataclasses import dataclass, field


@dataclass(frozen=True)
class IndexConfig:
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    #: pip merges candidates from every index; uv's default stops at the first index
    #: that has the package. Keep pip's behaviour so the same versions are found.
    index_strategy: str = "unsafe-best-match"
    sources: tuple[str, ...] = field(default=(), compare=False)

    def uv_args(self) -> list[str]:
        args: list[str] = []
        if self.index_url:
            args += ["--index-url", self.index_url]
        for url in self.extra_index_urls:
            args += ["--extra-index-url", url]
        for link in self.find_links:
            args += ["--find-links", link]
        args += ["--index-strategy", self.index_strategy]
        return args

    def key_material(self) -> dict[str, object]:
        return {
            "index_url": self.index_url,
            "extra_index_urls": list(self.extra_index_urls),
            "find_links": list(self.find_links),
            "index_strategy": self.index_strategy,
        }


def _values(raw: str) -> list[str]:
    return [v for v in shlex.split(raw) if v]


def parse_pip_config_list(text: str) -> IndexConfig:
    """Parse ``pip config list`` output: lines ``scope.key='value'``.

    Later scopes override earlier ones the way pip applies them (the environment,
    ``:env:``, over files); within one key, several values are space-separated.
    """
    settings: dict[str, tuple[int, list[str]]] = {}
    sources: list[str] = []
    for line in text.splitlines():
        if "=" not in line:
            continue
        lhs, rhs = line.split("=", 1)
        scope, _, key = lhs.strip().rpartition(".")
        key = key.strip()
        if key not in {"index-url", "extra-index-url", "find-links"}:
            continue
        priority = 2 if scope.startswith(":env:") else 1
        value = rhs.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        current = settings.get(key)
        if current is None or priority >= current[0]:
            settings[key] = (priority, _values(value))
        sources.append(lhs.strip())
    index = settings.get("index-url", (0, []))[1]
    return IndexConfig(
        index_url=index[0] if index else None,
        extra_index_urls=tuple(settings.get("extra-index-url", (0, []))[1]),
        find_links=tuple(settings.get("find-links", (0, []))[1]),
        sources=tuple(sources),
    )


def pip_index_config(python: str = sys.executable) -> IndexConfig:
    """The find-links and indexes pip would use on this machine (none when pip is absent)."""
    try:
        out = subprocess.run(
            [python, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return IndexConfig()
    if out.returncode != 0:
        return IndexConfig()
    return parse_pip_config_list(out.stdout)
