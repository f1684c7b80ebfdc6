"""The released versions of a package, as the configured indexes offer them.

``pip index versions`` is asked (it reads pip's configuration, so local find-links
and extra indexes count, exactly as for the environments uv builds from the same
settings); its list is filtered to the versions between two endpoints.
"""

from __future__ import annotations

import re
import subprocess
import sys

from packaging.version import InvalidVersion, Version

_AVAILABLE = re.compile(r"^Available versions:\s*(?P<versions>.+)$", re.MULTILINE)


class VersionsUnavailable(Exception):
    pass


def parse_available(text: str) -> list[Version]:
    match = _AVAILABLE.search(text)
    if not match:
        return []
    versions = []
    for raw in match.group("versions").split(","):
        try:
            versions.append(Version(raw.strip()))
        except InvalidVersion:
            continue
    return sorted(set(versions))


def released_versions(package: str, pre: bool = False, python: str = sys.executable) -> list[Version]:
    """Every version of ``package`` on the indexes, oldest first."""
    args = [python, "-m", "pip", "index", "versions", package, "--disable-pip-version-check"]
    if pre:
        args.append("--pre")
    out = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
    versions = parse_available(out.stdout)
    if not versions:
        reason = (out.stderr or out.stdout).strip().splitlines()
        raise VersionsUnavailable(reason[-1] if reason else f"no versions of {package} found")
    return versions


def between(versions: list[Version], low: Version, high: Version, pre: bool = False) -> list[Version]:
    """The versions from ``low`` to ``high`` inclusive; pre-releases only when asked
    (an endpoint that is one always counts)."""
    return [v for v in versions if low <= v <= high and (pre or not v.is_prerelease or v in (low, high))]
