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

import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

from packaging.markers import InvalidMarker, Marker, default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from harness.core.errors import UserError
from harness.core.user_files import read_named_text
from harness.environments.inventory import Listing, list_distributions

#: The name a stack gives the interpreter's own version.
PYTHON = "python"
#: How large a requirements or lock file may be (a lock of a large project is a few MB).
MAX_FILE_BYTES = 32 * 2**20

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


#: How many requirements files one may bring in with ``-r`` (itself included), and how deep the includes go.
MAX_INCLUDED_FILES = 32
MAX_INCLUDE_DEPTH = 8
_INCLUDE = re.compile(r"^(?:-r|--requirement)(?:\s*=\s*|\s+|(?=[^\s-]))(?P<target>\S.*)$")
_COMMENT = re.compile(r"(^|\s+)#.*$")
_FIX_LOCK = "pass a lock (pip freeze > FILE, uv pip compile, uv.lock) or pin it (name==version)"
_FIX_RANGE = (
    "pass --as-of DAY to resolve it as of a day, or a lock (pip freeze > FILE, uv pip compile, uv.lock), "
    "or pin it (name==version)"
)


def marker_environment() -> dict[str, str]:
    """What a requirement's environment marker is evaluated against: the platform ft-regress runs on (where
    ``--prove`` builds a stack), as pip would evaluate it here."""
    return {key: str(value) for key, value in default_environment().items()}


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(number of its first line, the line) of a requirements file as pip reads it: a line ending with a
    backslash continued on the next, comments dropped."""
    pending: list[str] = []
    first = 0
    lines = text.splitlines()
    for number, raw in enumerate(lines, 1):
        if not pending:
            first = number
        continued = raw.endswith("\\")
        body = raw[:-1] if continued else raw
        if continued and number < len(lines):
            pending.append(body)
            continue
        line = _COMMENT.sub("", " ".join([*pending, body])).strip()
        pending = []
        if line:
            yield first, line


def _requirement_text(line: str) -> str:
    """The requirement of a line, without the options pip allows after it (``--hash=...``)."""
    words = line.split()
    cut = next((i for i, word in enumerate(words) if i and word.startswith("-")), len(words))
    return " ".join(words[:cut])


@dataclass
class _Pins:
    """What a requirements file (and what it includes) pins for this platform, each package once; with
    ``ranges``, what it asks for without pinning it too (a range, a bare name)."""

    strict: bool
    environment: dict[str, str] = field(default_factory=marker_environment)
    #: Package -> (version, where it is pinned).
    found: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: Package -> (specifier, "where: the line"), ranges of one package joined (``>=1,<2``); with ``ranges`` only.
    ranges: dict[str, tuple[str, str]] | None = None
    files: int = 0

    def pin(self, name: str, version: str, where: str, field_: str) -> None:
        known = self.found.get(name)
        if known is not None and known[0] != version:
            platform = self.environment.get("sys_platform", "?")
            raise UserError(
                where,
                field_,
                f"pins {name} at {version}, and {known[1]} pins it at {known[0]}, both for this platform ({platform})",
                "keep one pin per package: pip refuses such a file (a double requirement)",
            )
        if known is None:
            self.found[name] = (version, f"{where} {field_}".strip())

    def requirement(self, where: str, field_: str, text: str, line: str | None = None) -> None:
        """One requirement (``text``, as ``line`` writes it) of ``where``."""
        line = text if line is None else line
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            if self.strict:
                raise UserError(where, field_, f"{line!r} is not a requirement pip reads", _FIX_LOCK) from None
            return
        if requirement.marker is not None and not requirement.marker.evaluate(self.environment):
            return  # not installed on this platform
        name = canonicalize_name(requirement.name)
        version = _pinned(requirement)
        if version is not None:
            self.pin(name, version, where, field_)
        elif requirement.url:
            return  # a git or directory reference without a version in its name: no release to hold it to
        elif self.ranges is not None:
            spec, said = self.ranges.get(name, ("", ""))
            joined = ",".join(x for x in (spec, str(requirement.specifier)) if x)
            self.ranges[name] = (joined, said or f"{where}: {field_}: {line!r}".replace(": :", ":"))
        elif self.strict:
            raise UserError(where, field_, f"{line!r} is not a pinned version", _FIX_LOCK)

    def line(self, where: str, number: int, line: str) -> None:
        self.requirement(where, f"line {number}" if number else "", _requirement_text(line), line)

    def text(self, text: str, where: str, include: Callable[[str, str, int], None] | None = None) -> None:
        for number, line in _logical_lines(text):
            included = _INCLUDE.match(line)
            if included is not None:
                if include is None:
                    if self.strict:
                        raise UserError(where, f"line {number}", "includes another file (-r)", "pass the file itself")
                    continue
                include(included["target"].strip(), where, number)
            elif not line.startswith("-"):
                self.line(where, number, line)
            # -c (constraints install nothing), -e (the project itself), --index-url, -f...: no pins

    def requirements(self, source: str, complete: bool) -> Requirements:
        """What was read, a pin that lies outside a range of the same package refused."""
        ranges = dict(self.ranges or {})
        for name, (spec, said) in list(ranges.items()):
            if name in self.found:
                version, where = self.found[name]
                if not SpecifierSet(spec, prereleases=True).contains(Version(version)):
                    raise UserError(where, "", f"pins {name} at {version}, outside {said}", "keep one of the two")
                del ranges[name]
        return Requirements(
            source=source,
            pins={name: version for name, (version, _) in self.found.items()},
            ranges=ranges,
            complete=complete,
        )


@dataclass(frozen=True)
class Requirements:
    """What a requirements file, a lock or a project's dependencies ask for on this platform: the packages pinned
    (``pins``), and those only given a range or a name (``ranges``: the specifier, and where it is written). A
    lock's is ``complete``: everything the environment holds, each pinned."""

    source: str
    pins: Mapping[str, str]
    ranges: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    complete: bool = False

    def stack(self, option: str = "--requirements") -> Stack:
        """The stack it pins; a ``UserError`` naming the first requirement that is not a pin."""
        if self.ranges:
            _, said = next(iter(self.ranges.values()))
            where, _, rest = said.partition(": ")
            field_, _, line = rest.partition(": ")
            raise UserError(where, field_, f"{line or rest} is not a pinned version", _FIX_RANGE)
        if not self.pins:
            raise UserError(self.source, "", "pins no package", _FIX_LOCK)
        return Stack(source=self.source, versions=dict(self.pins), complete=self.complete)

    def wanted(self, packages: Collection[str]) -> list[str]:
        """The requirement lines (``name`` with its specifier) of ``packages`` it names, pins and ranges."""
        pins = [f"{n}=={v}" for n, v in self.pins.items() if n in packages]
        return [*pins, *(f"{n}{spec}" for n, (spec, _) in self.ranges.items() if n in packages)]


def _pinned(requirement: Requirement) -> str | None:
    """The version a requirement pins (``==``/``===`` a whole version, or a wheel's or sdist's file name)."""
    if requirement.url:
        return _from_url(requirement.name, requirement.url)
    specs = list(requirement.specifier)
    if len(specs) != 1 or specs[0].operator not in ("==", "===") or specs[0].version.endswith(".*"):
        return None
    try:
        Version(specs[0].version)
    except InvalidVersion:
        return None
    return specs[0].version


def pins_from_freeze(text: str, where: str = "", strict: bool = False) -> dict[str, str]:
    """Package -> version from ``pip freeze`` output (or requirements compiled to pins), each requirement's
    environment marker evaluated for this platform (``marker_environment``). With ``strict``, a requirement that
    is not a pin (``torch>=2.0``, a reference without a version) or an include (``-r``: text has no directory to
    find it in) is a ``UserError`` naming ``where`` and the line: a stack is what is installed. A package pinned
    at two versions for this platform is refused either way, never one taken over the other."""
    pins = _Pins(strict)
    pins.text(text, where)
    return {name: version for name, (version, _) in pins.found.items()}


def _read_text_into(pins: _Pins, path: Path, option: str) -> None:
    """A requirements file and every file it includes with ``-r`` (found beside the file that includes it; at
    most ``MAX_INCLUDED_FILES`` files, ``MAX_INCLUDE_DEPTH`` deep; a cycle, or an include by URL, refused naming
    the line), each read as every file a user names is read, into ``pins``."""
    fix = "pass a uv.lock, pylock.toml or pip freeze output"

    def read(file: Path, chain: tuple[str, ...]) -> None:
        pins.files += 1
        text = read_named_text(file, option, fix, limit=MAX_FILE_BYTES, what="a lock")
        real = os.path.realpath(file)

        def include(target: str, where: str, number: int) -> None:
            line = f"line {number}"
            if "://" in target:
                raise UserError(where, line, f"includes {target} by URL", "download it and pass the file itself")
            found = file.parent / target
            if os.path.realpath(found) in (*chain, real):
                raise UserError(where, line, f"includes {found}, which includes {where} again (a cycle)", "remove one")
            if len(chain) + 1 >= MAX_INCLUDE_DEPTH or pins.files >= MAX_INCLUDED_FILES:
                raise UserError(
                    where,
                    line,
                    f"includes more than {MAX_INCLUDED_FILES} files or {MAX_INCLUDE_DEPTH} levels deep",
                    "pass the lock itself (pip freeze > FILE)",
                )
            read(found, (*chain, real))

        pins.text(text, str(file), include)

    read(path, ())


def read_pins(path: Path, option: str = "", strict: bool = True) -> dict[str, str]:
    """``pins_from_freeze`` of a requirements file and of every file it includes with ``-r``."""
    pins = _Pins(strict)
    _read_text_into(pins, path, option)
    return {name: version for name, (version, _) in pins.found.items()}


def _pyproject(path: Path, data: dict[str, object]) -> Requirements:
    """A project's dependencies (PEP 621's ``[project] dependencies`` and every ``optional-dependencies`` group,
    PEP 735's ``[dependency-groups]``), markers evaluated for this platform."""
    pins = _Pins(strict=True, ranges={})
    project = data.get("project")
    lists: list[tuple[str, object]] = []
    if isinstance(project, dict):
        lists.append(("project.dependencies", project.get("dependencies", [])))
        extras = project.get("optional-dependencies", {})
        if isinstance(extras, dict):
            lists += [(f"project.optional-dependencies.{k}", v) for k, v in extras.items()]
    groups = data.get("dependency-groups", {})
    if isinstance(groups, dict):
        lists += [(f"dependency-groups.{k}", v) for k, v in groups.items()]
    found = 0
    for field_, entries in lists:
        if not isinstance(entries, list):
            raise UserError(path, field_, "is not a list of requirements", "write it as PEP 621 says")
        for i, entry in enumerate(entries):
            if isinstance(entry, str):  # a {include-group = ...} table: that group is read on its own
                found += 1
                pins.requirement(str(path), f"{field_}[{i}]", entry)
    if not found:
        tool = data.get("tool")
        poetry = isinstance(tool, dict) and "poetry" in tool
        raise UserError(
            path,
            "project.dependencies",
            "names no requirement" + (" (a Poetry project's [tool.poetry] is not read)" if poetry else ""),
            "pass its lock (uv.lock, poetry.lock) or pip freeze output",
        )
    return pins.requirements(str(path), complete=False)


def read_requirement_file(path: Path, option: str = "--requirements") -> Requirements:
    """What a file asks for on this platform: a pip requirements file (markers evaluated, ``-r`` followed, hashes
    and options after a requirement ignored), a lock (``uv.lock``, ``poetry.lock``, ``pylock.toml``: ``complete``),
    or a project's ``pyproject.toml`` (its dependencies, every optional group)."""
    fix = "pass a requirements file, a uv.lock, poetry.lock or pylock.toml, or a pyproject.toml"
    if path.suffix in (".lock", ".toml") or path.name.startswith("pylock"):
        text = read_named_text(path, option, fix, limit=MAX_FILE_BYTES, what="a lock")
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise UserError(path, "", f"is not TOML ({exc})", "pass the file as its tool wrote it, unedited") from None
        if path.name == "pyproject.toml" or ("project" in data and "package" not in data and "packages" not in data):
            return _pyproject(path, data)
        return Requirements(source=str(path), pins=_toml_packages(path, data), complete=True)
    pins = _Pins(strict=True, ranges={})
    _read_text_into(pins, path, option)
    return pins.requirements(str(path), complete=False)


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
        marker = entry.get("marker")
        if isinstance(marker, str) and not _marker_holds(path, f"{key}[{i}]", marker):
            continue  # a PEP 751 lock's package for another platform
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


def _marker_holds(path: Path, field_: str, marker: str) -> bool:
    try:
        return Marker(marker).evaluate(marker_environment())
    except InvalidMarker:
        raise UserError(
            path, field_, f"marker {marker!r} is not an environment marker", "regenerate the lock"
        ) from None


def read_requirements(path: Path, option: str = "--requirements") -> Stack:
    """The stack a lock or pinned requirements file installs on this platform (``read_requirement_file``); a
    requirement that pins nothing is a ``UserError`` naming it (``--as-of`` resolves such a file as of a day)."""
    requirements = read_requirement_file(path, option)
    stack = requirements.stack(option)
    # A lock says which Python it allows (a range), not which one runs: the stack's python stays unknown. A pip
    # requirements file pinning every line is taken as the environment's listing, as pip freeze writes it.
    return Stack(source=stack.source, versions=stack.versions, complete=True)


def resolve_requirements(
    requirements: Requirements,
    as_of: str,
    packages: Collection[str],
    resolve: Callable[[list[str]], Mapping[str, str]],
) -> Stack:
    """The stack ``requirements`` install as of ``as_of``: the lines of ``packages`` (those documented failures
    depend on) resolved together by ``resolve`` (pins as written, the rest released before the day), the
    releases they bring in (a torch that accelerate needs) included. The file's other lines take no part (a
    package that builds against torch cannot be resolved without it); a package not named may be installed by
    them, so the stack is not complete."""
    lines = requirements.wanted(packages)
    if not lines:
        raise UserError(
            requirements.source,
            "",
            f"names none of {', '.join(sorted(packages))}",
            "pass the file that lists the training stack's packages",
        )
    versions = {str(canonicalize_name(k)): v for k, v in resolve(lines).items()}
    return Stack(source=f"{requirements.source} as of {as_of}", versions=versions, complete=False)


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
