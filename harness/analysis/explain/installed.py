"""A user's installed versions: from ``pip freeze`` output, or from the interpreter running this.

Names are canonical (``packaging``); versions as installed (``2.13.0+cpu``). In ``pip freeze``
output, ``name==version`` lines count; a direct reference (``name @ file:///.../name-1.2-...whl``)
counts when its wheel or sdist file name carries the version; editable installs, options and
comments are skipped.
"""

from __future__ import annotations

import re
from importlib import metadata
from urllib.parse import unquote

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

_PINNED = re.compile(r"^\s*(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*===?\s*(?P<version>[^\s;#]+)")
_DIRECT = re.compile(r"^\s*(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*@\s*(?P<url>\S+)")
_SDIST = re.compile(r"^(?P<name>.+?)-(?P<version>\d[^-]*)\.(?:tar\.gz|zip)$")


def _from_url(name: str, url: str) -> str | None:
    filename = unquote(url.rstrip("/").rsplit("/", 1)[-1])
    if filename.endswith(".whl"):
        try:
            return str(parse_wheel_filename(filename)[1])
        except (InvalidWheelFilename, InvalidVersion):
            return None
    sdist = _SDIST.match(filename)
    if sdist and canonicalize_name(sdist["name"]) == canonicalize_name(name):
        return sdist["version"]
    return None


def from_freeze(text: str) -> dict[str, str]:
    """Package -> version from ``pip freeze`` (or a requirements file of pins)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        pinned = _PINNED.match(line)
        if pinned:
            try:
                Version(pinned["version"])
            except InvalidVersion:
                continue
            found[canonicalize_name(pinned["name"])] = pinned["version"]
            continue
        direct = _DIRECT.match(line)
        if direct:
            version = _from_url(direct["name"], direct["url"])
            if version:
                found[canonicalize_name(direct["name"])] = version
    return found


def here() -> dict[str, str]:
    """Package -> version of every distribution the running interpreter has."""
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name and dist.version:
            found.setdefault(canonicalize_name(name), dist.version)
    return found
