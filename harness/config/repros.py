"""Finds the repros: the built-in ones (the modules of ``repros.catalog``, part of the harness),
those installed packages declare (the ``ft_regress.repros`` entry-point group: ``REPRO_SOURCES``)
and a user's (the files of ``--repros-dir`` directories and ``$FT_REGRESS_REPROS``).

An installed package names a module under ``ft_regress.repros`` (``[project.entry-points.
"ft_regress.repros"] my-team = "my_team_repros"``): a package, whose directory's repro files are its
repros, or one module, one repro. It is found where it is installed without being imported, and its
files are read like a user's.

A user's repro file never runs inside the orchestrator: each is read by a child process
(``python -m repros.runtime.describe``) under a time limit, and what comes back is its ``SPEC``
as data. A file whose import exits the process, changes directory, hangs or raises becomes a
``BrokenRepro`` with the reason, reported as an ``INFRA`` item under its file's name, never
silently dropped. Which files are repros is decided statically by the repro kinds
(``repros/runtime/kinds``): a helper module beside a repro is not one.
"""

from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib.machinery import ModuleSpec, PathFinder
from importlib.metadata import EntryPoint
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet

import repros
import repros.catalog
from harness.core.errors import UserError
from harness.core.json import JsonObject
from harness.core.names import natural_key
from harness.core.processes import isolated_environ
from repros.runtime.kinds import BUILTIN_KIND, KINDS, is_file_ref, kind_of
from repros.runtime.kinds.base import too_large
from repros.runtime.registry import Registry
from repros.runtime.spec import ReproSpec, spec_from_data

REPROS_PATH_ENV = "FT_REGRESS_REPROS"
#: How long reading one user's repro file may take.
DESCRIBE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Repro:
    spec: ReproSpec
    #: A dotted module name, or the path of a user's repro file.
    module: str
    kind: str = "module"
    #: What its ranks are sent besides the reference (a script repro's declaration), JSON data.
    rank_params: JsonObject = field(default_factory=dict, hash=False, compare=False)

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def builtin(self) -> bool:
        return not is_file_ref(self.module)


@dataclass(frozen=True)
class BrokenRepro:
    id: str
    module: str
    reason: str
    #: The id the file means to declare, where it could be read (a script repro's ``id:``).
    declared_id: str | None = None
    #: The loader's own message, as a user's error: what is wrong, where in the file, the fix.
    error: UserError | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Discovery:
    repros: dict[str, Repro]
    #: Files that could not be read or lack a SPEC, by their file's stem.
    broken: dict[str, BrokenRepro]


def user_dirs_from_env() -> list[Path]:
    """The directories of ``$FT_REGRESS_REPROS``; one that is not a directory is a ``UserError``."""
    dirs = [Path(p) for p in os.environ.get(REPROS_PATH_ENV, "").split(os.pathsep) if p]
    for directory in dirs:
        if not is_directory(directory):
            raise UserError(
                f"${REPROS_PATH_ENV}",
                str(directory),
                "is not a directory",
                f"set it to directories of repro files, separated by '{os.pathsep}', or unset it",
            )
    return dirs


def is_directory(path: Path) -> bool:
    """Whether ``path`` is a directory; False, not an exception, for a name too long to look up."""
    try:
        return path.is_dir()
    except OSError:
        return False


class SourceNotFound(Exception):
    """An entry point's module is not where its package says."""


def locate(point: EntryPoint) -> Path:
    """The directory (a package) or file (a module) of the module ``point`` names, found the way
    an import would find it, but without running any of it."""
    search: list[str] | None = None
    spec: ModuleSpec | None = None
    parts = point.module.split(".")
    for i in range(len(parts)):
        spec = PathFinder.find_spec(".".join(parts[: i + 1]), search)
        if spec is None:
            raise SourceNotFound(f"module {point.module} is not installed where its package says")
        search = list(spec.submodule_search_locations or [])
    assert spec is not None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    if spec.origin is None:
        raise SourceNotFound(f"module {point.module} has no file")
    return Path(spec.origin)


#: Where installed packages' repros are, by entry-point name (read whenever repros are discovered).
REPRO_SOURCES: Registry[Path] = Registry("repro source", group="ft_regress.repros", load=locate)


def installed_files() -> tuple[list[Path], dict[str, BrokenRepro]]:
    """The repro files of every installed package's entry point; an entry whose module cannot be
    found is broken, under its name."""
    files: list[Path] = []
    broken: dict[str, BrokenRepro] = {}
    for name in REPRO_SOURCES:
        try:
            where = REPRO_SOURCES[name]
        except (SourceNotFound, ImportError, ValueError) as exc:
            origin = REPRO_SOURCES.origin(name)
            broken[name] = BrokenRepro(name, origin, f"its entry point cannot be followed: {exc}")
            continue
        files += user_files([where]) if where.is_dir() else [where.resolve()]
    return files, broken


def _builtin() -> Iterable[tuple[str, str]]:
    for info in sorted(pkgutil.iter_modules(repros.catalog.__path__), key=lambda i: natural_key(i.name)):
        if not info.ispkg and not info.name.startswith("_"):
            yield info.name, f"repros.catalog.{info.name}"


def user_files(dirs: Sequence[Path]) -> list[Path]:
    """The files of ``dirs`` that declare a repro of some kind (read, not run)."""
    found = []
    for directory in dict.fromkeys(Path(d).resolve() for d in dirs):
        try:
            entries = sorted(directory.iterdir())
        except OSError as exc:
            raise UserError(
                directory, "", f"cannot be read as a directory of repros ({exc.strerror})", "check the path"
            ) from None
        for path in entries:
            if path.is_file() and not path.name.startswith((".", "_")) and kind_of(path) is not None:
                found.append(path.resolve())
    return list(dict.fromkeys(found))


@dataclass(frozen=True)
class Described:
    spec: ReproSpec | None
    kind: str = ""
    reason: str = ""
    rank_params: JsonObject = field(default_factory=dict)
    declared_id: str | None = None
    error: UserError | None = None


def describe_in_child(path: Path, timeout_s: float = DESCRIBE_TIMEOUT_S) -> Described:
    """The file's SPEC, its kind and what its ranks need, or why there is none; read by a child process."""
    with tempfile.TemporaryDirectory(prefix="ft-regress-describe-") as scratch:
        out = Path(scratch) / "spec.json"
        package_root = str(Path(repros.__file__).resolve().parent.parent)
        env = {**isolated_environ(), "PYTHONPATH": package_root}
        try:
            done = subprocess.run(
                [sys.executable, "-m", "repros.runtime.describe", str(path), "--out", str(out)],
                cwd=scratch,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            why = f"reading it took more than {timeout_s:.0f} s (does it run something at import?)"
            return Described(None, reason=why)
        if not out.exists():
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            said = f": {' / '.join(tail)}" if tail else ""
            ended = f"the process reading it ended (exit code {done.returncode})"
            return Described(None, reason=f"{ended} before it said what it is{said}")
        try:
            result = json.loads(out.read_text(encoding="utf-8"))
            if not result.get("ok"):
                parts = result.get("declaration_error")
                error = UserError(parts["file"], parts["field"], parts["problem"], parts["fix"]) if parts else None
                named = result.get("declared_id")
                return Described(
                    None, reason=str(result.get("error")), declared_id=named if named else None, error=error
                )
            params = result.get("rank_params") or {}
            if not isinstance(params, dict):
                raise TypeError("rank_params is not a mapping")
            return Described(spec_from_data(result["spec"]), str(result.get("kind") or ""), "", params)
        except (ValueError, KeyError, TypeError) as exc:
            return Described(None, reason=f"its SPEC is not usable: {exc}")


def unusable_expectation(spec: ReproSpec) -> str | None:
    """Why one of the repro's expectations could never be checked (a version specifier that is
    none), or None: found where the repro is read, not when an outcome is compared with it."""
    for i, expectation in enumerate(spec.expectations):
        ranges = [("when", expectation.when), *(("under", stack) for stack in expectation.under)]
        for what, stack in ranges:
            for package, specifier in stack.items():
                try:
                    SpecifierSet(specifier)
                except InvalidSpecifier:
                    return (
                        f"its expectation {i} ({expectation.mode}) says {what} {package} {specifier!r}, which is "
                        "not a version specifier; write it like '<0.19.3' or '>=2.5,<2.7'"
                    )
    return None


def discover(extra_dirs: Sequence[Path] = ()) -> Discovery:
    found: dict[str, Repro] = {}
    broken: dict[str, BrokenRepro] = {}

    def add(
        stem: str,
        ref: str,
        spec: ReproSpec | None,
        kind: str,
        reason: str,
        params: JsonObject,
        described: Described | None = None,
    ) -> None:
        unusable = unusable_expectation(spec) if spec is not None else None
        if spec is None or unusable is not None:
            named = described.declared_id if described is not None else (spec.id if spec is not None else None)
            error = described.error if described is not None else None
            broken[stem] = BrokenRepro(stem, ref, reason or str(unusable), named, error)
        elif spec.id in found:
            broken[stem] = BrokenRepro(stem, ref, f"repro id {spec.id!r} is already taken by {found[spec.id].module}")
        else:
            found[spec.id] = Repro(spec=spec, module=ref, kind=kind, rank_params=params)

    for stem, ref in _builtin():
        try:
            loaded = KINDS[BUILTIN_KIND].load(ref)
        except Exception as exc:  # noqa: BLE001 - a broken built-in is reported like any broken repro
            add(stem, ref, None, "", f"cannot be imported: {type(exc).__name__}: {exc}", {})
        else:
            add(stem, ref, loaded.spec, BUILTIN_KIND, "", loaded.rank_params)
    installed, unfollowed = installed_files()
    broken.update(unfollowed)
    for path in dict.fromkeys([*installed, *user_files([*extra_dirs, *user_dirs_from_env()])]):
        refused = too_large(path)
        if refused is not None:  # not read, here or in a child
            add(path.stem, str(path), None, "", f"{refused.problem}; {refused.fix}", {})
            continue
        described = describe_in_child(path)
        add(path.stem, str(path), described.spec, described.kind, described.reason, described.rank_params, described)
    return Discovery(repros=found, broken=broken)
