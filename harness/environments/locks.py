"""A floating cell's lock: its specs resolved, now or as of a day, to one version of every package.

``uv pip compile --refresh`` resolves the cell's requirements for its interpreter and platform
(the shared uv cache revalidates each index page, so a release published a minute ago is seen;
about a second when nothing moved). The lock is the sorted ``name==version`` lines it prints: what
the environment installs and is keyed by, so a new release builds a new environment the first run
it is out, and only then.

As of a day (``--as-of``): every package resolves to what was released before that day, except
the cell's exact pins, which stay as written even when newer (uv's ``--exclude-newer`` with
``--exclude-newer-package PIN=false``). A pin may need a dependency released after the day; uv names
it, and it is exempted from the cut-off too (said in the lock's ``exempted``). Files from a
find-links folder carry no upload date, so uv cannot cut them off: a floating package, or any package
a local find-links folder holds (torch brought in by accelerate, not named), that resolved to a release
first uploaded after the day (PyPI's dates, PEP 691) is capped below it and resolved again (said in
``capped``).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from harness.core.as_of import as_of_value
from harness.environments.base import EnvironmentUnavailable, EnvRequest, installer_reason
from harness.environments.index import IndexConfig

#: How many times a resolution is retried (an exempted dependency, a capped find-links release).
MAX_ATTEMPTS = 12
#: What uv says of a package the cut-off filtered out that a pin needs.
_FILTERED = re.compile(r"`([A-Za-z0-9._-]+)` was filtered by `exclude-newer`")
PEP_691 = "application/vnd.pypi.simple.v1+json"
DEFAULT_SIMPLE = "https://pypi.org/simple"


@dataclass(frozen=True)
class Lock:
    lines: tuple[str, ...]
    #: The day it was resolved as of (None: now), and when it was resolved.
    as_of: str | None
    resolved_at: str
    seconds: float
    #: Packages a pin needed newer than the day, resolved without the cut-off.
    exempted: tuple[str, ...] = ()
    #: Floating packages capped below a release first uploaded after the day (from a find-links folder).
    capped: dict[str, str] = field(default_factory=dict)

    def versions(self) -> dict[str, str]:
        return dict(line.split("==", 1) for line in self.lines)

    def describe(self) -> dict[str, object]:
        return {
            "as_of": self.as_of,
            "resolved_at": self.resolved_at,
            "seconds": round(self.seconds, 3),
            "exempted": list(self.exempted),
            "capped": dict(self.capped),
        }


class UvRunner(Protocol):
    """What resolving needs of the environment builder: uv, the interpreter, the indexes."""

    uv: str
    index: IndexConfig

    def find_python(self, request: str) -> tuple[str, str]: ...

    def uv_environ(self) -> dict[str, str]: ...


def cutoff(as_of: str) -> str:
    """Released before ``as_of``, a day or a UTC time (``as_of_value``): uv's cut-off at the day's
    first second (uv reads a plain date as including the day), or at the time itself."""
    moment = as_of_value(as_of)
    return moment if "T" in moment else f"{moment}T00:00:00Z"


def parse_lock(text: str) -> tuple[str, ...]:
    lines = []
    for line in text.splitlines():
        name, sep, version = line.strip().partition("==")
        if sep and name and not name.startswith("#"):
            lines.append(f"{canonicalize_name(name.strip())}=={version.split(';')[0].strip()}")
    return tuple(sorted(lines))


class ReleaseDates:
    """When each release of a package was first uploaded, from the index's PEP 691 pages (PyPI's
    by default), asked once per package per run; None where the index gives no date."""

    def __init__(self, simple_url: str = DEFAULT_SIMPLE) -> None:
        self.simple_url = simple_url.rstrip("/")
        self._seen: dict[str, dict[str, dt.datetime]] = {}
        self._lock = threading.Lock()

    def first_upload(self, package: str, version: str) -> dt.datetime | None:
        name = canonicalize_name(package)
        with self._lock:
            if name not in self._seen:
                self._seen[name] = self._fetch(name)
        try:
            return self._seen[name].get(str(Version(version).public))
        except InvalidVersion:
            return None

    def _fetch(self, name: str) -> dict[str, dt.datetime]:
        request = urllib.request.Request(f"{self.simple_url}/{name}/", headers={"Accept": PEP_691})
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310 - an index URL
                page = json.loads(answer.read())
        except (OSError, ValueError, urllib.error.URLError):
            return {}
        dates: dict[str, dt.datetime] = {}
        for item in page.get("files") or []:
            uploaded = item.get("upload-time")
            version = _version_of(name, str(item.get("filename") or ""))
            if not uploaded or version is None:
                continue
            when = dt.datetime.fromisoformat(str(uploaded).replace("Z", "+00:00"))
            if version not in dates or when < dates[version]:
                dates[version] = when
        return dates


def _version_of(name: str, filename: str) -> str | None:
    """The release a distribution file belongs to (a wheel's or an sdist's name)."""
    stem = filename.removesuffix(".whl").removesuffix(".tar.gz").removesuffix(".zip")
    parts = stem.split("-")
    if len(parts) < 2 or canonicalize_name(parts[0]) != name:
        return None
    try:
        return str(Version(parts[1]).public)
    except InvalidVersion:
        return None


def resolve_lock(builder: UvRunner, request: EnvRequest, dates: ReleaseDates | None = None) -> Lock:
    """The lock ``request``'s floating specs resolve to, now or as of its day."""
    started = time.perf_counter()
    python_path, _ = builder.find_python(request.python)
    base = ["pip", "compile", "--no-header", "--no-annotate", "--refresh", "--python", python_path]
    base += builder.index.uv_args()
    pins = sorted(set(request.packages) - set(request.floating))
    if request.exclude_newer:
        base += ["--exclude-newer", request.exclude_newer]  # the cell's own cut-off: everything, pins too
    elif request.as_of:
        base += ["--exclude-newer", cutoff(request.as_of)]
        base += [arg for pin in pins for arg in ("--exclude-newer-package", f"{pin}=false")]
    if request.prerelease:
        base += ["--prerelease", "allow"]
    exempted: list[str] = []
    capped: dict[str, str] = {}
    dates = dates or ReleaseDates()
    with tempfile.TemporaryDirectory(prefix="ft-regress-lock-") as scratch:
        if request.exclude_packages:
            (Path(scratch) / "excludes.txt").write_text("".join(f"{n}\n" for n in sorted(request.exclude_packages)))
            base += ["--excludes", str(Path(scratch) / "excludes.txt")]
        for _ in range(MAX_ATTEMPTS):
            args = [*base, *(a for name in exempted for a in ("--exclude-newer-package", f"{name}=false"))]
            requirements = [*request.requirements(), *(f"{name}{cap}" for name, cap in sorted(capped.items()))]
            out = subprocess.run(
                [builder.uv, *args, "-"],
                input="\n".join(requirements) + "\n",
                capture_output=True,
                text=True,
                env=builder.uv_environ(),
                timeout=600,
                check=False,
            )
            if out.returncode != 0:
                filtered = [canonicalize_name(n) for n in _FILTERED.findall(out.stderr)]
                new = [n for n in dict.fromkeys(filtered) if n not in exempted and request.as_of]
                if not new:
                    raise EnvironmentUnavailable(installer_reason(out.stderr, out.returncode), log=out.stderr)
                exempted += new
                continue
            lines = parse_lock(out.stdout)
            undated = undated_packages(builder.index.find_links)
            late = (
                _released_after(request, lines, dates, undated) if request.as_of and not request.exclude_newer else {}
            )
            if not late:
                return Lock(lines, request.as_of, _now(), time.perf_counter() - started, tuple(exempted), capped)
            capped.update({name: f"<{Version(version).public}" for name, version in late.items()})
    raise EnvironmentUnavailable(
        f"no resolution as of {request.as_of} after {MAX_ATTEMPTS} attempts "
        f"(exempted {', '.join(exempted) or 'nothing'}, capped {capped or 'nothing'})"
    )


def undated_packages(find_links: Sequence[str]) -> set[str]:
    """The packages a local find-links folder holds files of: uv has no upload date for them."""
    names: set[str] = set()
    for link in find_links:
        folder = Path(link.removeprefix("file://"))
        if "://" in link.replace("file://", "", 1) or not folder.is_dir():
            continue
        for entry in folder.iterdir():
            stem = entry.name.removesuffix(".whl").removesuffix(".tar.gz").removesuffix(".zip")
            if stem != entry.name and "-" in stem:
                names.add(canonicalize_name(stem.split("-", 1)[0]))
    return names


def _released_after(
    request: EnvRequest, lines: tuple[str, ...], dates: ReleaseDates, undated: Iterable[str] = ()
) -> dict[str, str]:
    """The floating packages, and the ``undated`` ones wherever they came from (a dependency), the lock took
    at a release first uploaded on or after the day (an undated find-links file uv could not cut off):
    package -> that version. A pin stays as written."""
    assert request.as_of is not None
    day = dt.datetime.fromisoformat(cutoff(request.as_of).replace("Z", "+00:00"))
    versions = dict(line.split("==", 1) for line in lines)
    pinned = set(request.packages) - set(request.floating)
    late = {}
    for name in dict.fromkeys([*request.floating, *(n for n in undated if n in versions and n not in pinned)]):
        version = versions.get(name)
        uploaded = dates.first_upload(name, version) if version else None
        if uploaded is not None and uploaded >= day:
            late[name] = version or ""
    return late


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
