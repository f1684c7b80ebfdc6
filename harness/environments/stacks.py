"""A stack: which release of each package an environment has, read once, the same way wherever it comes from.

Four sources, one typed value (``Stack``):

- text as a user writes it (``--stack "torch==2.5.1 deepspeed==0.15.3"``): exact pins, separated by spaces or
  commas; ``python==3.11`` names the interpreter's version;
- a pip lock (``pip freeze`` output, or requirements compiled to pins by ``pip-compile`` / ``uv pip compile``):
  ``name==version`` lines, a direct reference whose wheel or sdist names its version, comments, options and
  editable installs skipped;
- a uv lock (``uv.lock``) or a PEP 751 lock (``pylock.toml``): every locked package with its version;
- the running interpreter (``read_interpreter``): what the passthrough provider's cells run, read by the
  interpreter itself, as its ranks would import it. ``check`` and ``atlas check --here`` read the stack
  through this one function, so both see the same versions.

Names are canonical (``packaging``), versions as installed (``2.13.0+cpu``). A stack whose source lists
everything installed (a lock, the interpreter) is ``complete``: a package it does not name is absent. A
malformed stack is a ``UserError`` naming the file (or the option), the line and the fix.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from harness.core.errors import UserError
from harness.environments.inventory import Listing, list_distributions

#: The name a stack gives the interpreter's own version.
PYTHON = "python"
#: How large a requirements or lock file may be (a lock of a large project is a few MB).
MAX_FILE_BYTES = 32 * 2**20

_PINNED = re.compile(r"^\s*(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*===?\s*(?P<version>[^\s;#\\]+)")
_DIRECT = re.compile(r"^\s*(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*@\s*(?P<url>\S+)")
_REQUIREMENT = re.compile(r"^\s*[A-Za-z0-9][A-Za-z0-9._-]*\s*(?:\[[^\]]*\])?\s*(?:[<>=!~]|$|;)")
_SDIST = re.compile(r"^(?P<name>.+?)-(?P<version>\d[^-]*)\.(?:tar\.gz|zip)$")
#: A pin as ``--stack`` takes it: a name, ``==`` (or ``===``) and a version.
_STACK_PIN = re.compile(r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*===?\s*(?P<version>[A-Za-z0-9][A-Za-z0-9.+!_-]*)")


@dataclass(frozen=True)
class Stack:
    """Which release of each package; ``python`` the interpreter's version where the source says it."""

    #: Where it was read: ``--stack``, a file's path, or the interpreter.
    source: str
    #: Canonical package name -> version as given (``2.13.0+cpu``).
    versions: Mapping[str, str] = field(default_factory=dict)
    python: str | None = None
    #: Whether the source lists everything the environment has (a lock, the interpreter).
    complete: bool = False

    def version(self, package: str) -> Version | None:
        """The parsed version of ``package`` (``python`` for the interpreter), or None where it is not named."""
        text = self.python if package == PYTHON else self.versions.get(canonicalize_name(package))
        if text is None:
            return None
        try:
            return Version(text)
        except InvalidVersion:
            return None

    def pins(self, packages: Iterable[str] | None = None) -> list[str]:
        """``name==version`` for each package named (of ``packages``, where given), in the given order."""
        names = list(self.versions) if packages is None else [canonicalize_name(p) for p in packages]
        return [f"{name}=={self.versions[name]}" for name in names if name in self.versions]

    def text(self, packages: Iterable[str] | None = None) -> str:
        """The stack as ``--stack`` takes it back (python first, where known)."""
        python = [f"{PYTHON}=={self.python}"] if self.python and packages is None else []
        return " ".join([*python, *self.pins(packages)])


def _version_text(where: str, field_: str, name: str, version: str) -> str:
    try:
        Version(version)
    except InvalidVersion:
        raise UserError(
            where, field_, f"{name}=={version}: {version!r} is not a version", "write it like 2.5.1"
        ) from None
    return version


def parse_stack_text(text: str, option: str = "--stack") -> Stack:
    """``"torch==2.5.1 deepspeed==0.15.3, peft==0.14.0"``: exact pins, ``python==3.11`` for the interpreter."""
    tokens = [t for t in re.split(r"[\s,]+", text.strip()) if t]
    if not tokens:
        raise UserError(option, repr(text), "names no package", 'write pins like "torch==2.5.1 deepspeed==0.15.3"')
    versions: dict[str, str] = {}
    python: str | None = None
    for token in tokens:
        pin = _STACK_PIN.fullmatch(token)
        if pin is None:
            raise UserError(
                option,
                token,
                "is not an exact pin",
                "write each package as name==version (torch==2.5.1): a stack is what is installed, not a range",
            )
        name = canonicalize_name(pin["name"])
        version = _version_text(option, token, name, pin["version"])
        if name == PYTHON:
            python = version
        elif name in versions and versions[name] != version:
            raise UserError(option, token, f"names {name} twice ({versions[name]} and {version})", "keep one")
        else:
            versions[name] = version
    return Stack(source=option, versions=versions, python=python)


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


def pins_from_freeze(text: str, where: str = "", strict: bool = False) -> dict[str, str]:
    """Package -> version from ``pip freeze`` output (or requirements compiled to pins). With ``strict``, a
    requirement that is not a pin (``torch>=2.0``, a reference without a version) is a ``UserError`` naming
    ``where`` and the line: a stack is what is installed."""
    found: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        pinned = _PINNED.match(line)
        if pinned:
            try:
                Version(pinned["version"])
            except InvalidVersion:
                if strict:
                    raise UserError(
                        where, f"line {number}", f"{line!r}: {pinned['version']!r} is not a version", "pin a release"
                    ) from None
                continue
            found[canonicalize_name(pinned["name"])] = pinned["version"]
            continue
        direct = _DIRECT.match(line)
        version = _from_url(direct["name"], direct["url"]) if direct else None
        if direct and version:
            found[canonicalize_name(direct["name"])] = version
        elif strict and (direct or _REQUIREMENT.match(line)):
            raise UserError(
                where,
                f"line {number}",
                f"{line!r} is not a pinned version",
                "pass a lock (pip freeze > FILE, uv pip compile, uv.lock) or pin it (name==version)",
            )
    return found


def _toml_packages(path: Path, data: dict[str, object]) -> dict[str, str]:
    """A uv lock's ``[[package]]`` or a PEP 751 lock's ``[[packages]]``: name -> version."""
    # uv.lock: [[package]]; pylock.toml (PEP 751): [[packages]].
    key = "packages" if "packages" in data or ("package" not in data and path.suffix == ".toml") else "package"
    entries = data.get(key)
    if not isinstance(entries, list):
        raise UserError(
            path, key, "is missing: not a uv.lock or pylock.toml", "pass a uv.lock, a pylock.toml or pip freeze output"
        )
    found: dict[str, str] = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise UserError(path, f"{key}[{i}]", "has no name", "regenerate the lock (uv lock)")
        name = canonicalize_name(entry["name"])
        source = entry.get("source")
        version = entry.get("version")
        if version is None and isinstance(source, dict) and ({"editable", "virtual"} & set(source)):
            continue  # the project itself
        if not isinstance(version, str):
            raise UserError(path, f"{key}[{i}] ({name})", "has no version", "regenerate the lock (uv lock)")
        version = _version_text(str(path), f"{key}[{i}]", name, version)
        if name in found and found[name] != version:
            raise UserError(
                path,
                f"{key}[{i}]",
                f"locks {name} at {found[name]} and {version} (a resolution forked by markers)",
                "pass the environment's own stack: --stack, pip freeze output, or --here in it",
            )
        found[name] = version
    return found


def read_requirements(path: Path) -> Stack:
    """The stack a lock or pinned requirements file installs (``uv.lock``, ``pylock.toml``, ``pip freeze``)."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise UserError(path, "", f"is {size} bytes, more than a lock holds", "pass the lock file itself")
        raw = path.read_bytes()
    except IsADirectoryError:
        raise UserError(path, "", "is a directory", "pass a uv.lock, pylock.toml or pip freeze output") from None
    except OSError as exc:
        raise UserError(path, "", f"cannot be read ({exc.strerror})", "check the path") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(path, "", "is not UTF-8 text", "pass a uv.lock, pylock.toml or pip freeze output") from None
    if path.suffix == ".lock" or path.suffix == ".toml" or path.name.startswith("pylock"):
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise UserError(path, "", f"is not TOML ({exc})", "pass the lock uv or pip wrote, unedited") from None
        versions = _toml_packages(path, data)
    else:
        versions = pins_from_freeze(text, str(path), strict=True)
    if not versions:
        raise UserError(path, "", "pins no package", "pass a lock: pip freeze > FILE, uv pip compile, or uv.lock")
    # A lock says which Python it allows (a range), not which one runs: the stack's python stays unknown.
    return Stack(source=str(path), versions=versions, complete=True)


def read_interpreter(python: str = sys.executable) -> Listing:
    """What ``python`` has installed, as its ranks import it (the caller's ``PYTHONPATH`` kept): the one
    reading of a running interpreter's stack (the passthrough provider, ``check``, ``atlas check --here``)."""
    return list_distributions(python, isolated=False)


def stack_here(python: str = sys.executable) -> Stack:
    """The running interpreter's stack, read by ``read_interpreter``."""
    try:
        listing = read_interpreter(python)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        raise UserError(
            "--here", python, f"its installed packages could not be listed ({exc})", "pass --stack"
        ) from None
    return Stack(
        source=f"the running interpreter ({python})",
        versions={canonicalize_name(k): v for k, v in listing.packages.items()},
        python=listing.python_version,
        complete=True,
    )
