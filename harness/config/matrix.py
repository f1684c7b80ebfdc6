"""matrix.yaml: load, validate against the schema, and resolve cells.

A cell inherits ``defaults`` and overrides what it names; a package set to ``null``
is not installed. Nothing here depends on a cell's name.
"""

from __future__ import annotations

import datetime as dt
import difflib
import functools
import hashlib
import json
import math
import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name

from harness.config.crosscheck import load_crosscheck
from harness.config.grid import load_grid
from harness.config.model import DEFAULT_PYTHON, DEFAULT_TIMEOUT_S, DEFAULT_WORLD_SIZE, Cell, Exclude, Matrix
from harness.config.repros import BrokenRepro, is_directory
from harness.config.yaml_safety import load_yaml
from harness.core.errors import UserError
from harness.core.json import JsonObject, JsonValue
from harness.core.names import one_of, unknown_repro_fix
from harness.core.user_files import read_named
from harness.environments import DEFAULT_PROVIDER, PROVIDERS, provider_class
from harness.environments.passthrough import PassthroughProvider
from harness.environments.specs import NEWEST
from repros.runtime.families import DEFAULT_FAMILY
from repros.runtime.spec import TRACKED_PACKAGES

MATRIX_FORMAT_HINT = "see docs/matrix.md, 'matrix.yaml format'"
#: A matrix is a few kilobytes; anything far larger is a mistake or an attack.
MAX_MATRIX_BYTES = 1 << 20
#: Per-item timeouts above a week are typos (and ``.inf`` is no timeout at all).
MAX_TIMEOUT_S = 7 * 24 * 3600.0


def _is_echo(error: jsonschema.ValidationError) -> bool:
    if error.validator not in ("additionalProperties", "unevaluatedProperties") or not isinstance(error.instance, dict):
        return False
    allowed = set(_properties(error))
    if error.validator == "unevaluatedProperties":
        allowed |= set(_keys(_in_schema("$defs", "settings", "properties")))
    return not (set(error.instance) - allowed)


def _check_numbers(path: Path, data: dict[str, Any]) -> None:
    """What JSON Schema cannot say about numbers: NaN passes every comparison."""
    tables = [("defaults", data.get("defaults") or {})]
    tables += [(f"cells.{name}", cell) for name, cell in (data.get("cells") or {}).items()]
    for where, table in tables:
        timeout = table.get("timeout_s")
        if timeout is not None and not (math.isfinite(timeout) and 0 < timeout <= MAX_TIMEOUT_S):
            raise UserError(
                path,
                f"{where}.timeout_s",
                f"{timeout!r} is not a usable timeout",
                f"give the seconds an item may take, more than 0 and at most {MAX_TIMEOUT_S:.0f}",
            )


def ecma_anchors(pattern: str) -> str:
    """``pattern`` with each ``$`` anchor meaning the end of the text, as in ECMA-262 (the dialect
    JSON Schema's ``pattern`` is written in): Python's ``$`` also matches before a final newline,
    so ``^[a-z]+$`` would let ``"name\\n"`` through."""
    out: list[str] = []
    in_class = False
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
        elif ch == "$":
            ch = r"\Z"
        out.append(ch)
        i += 1
    return "".join(out)


@functools.lru_cache(maxsize=64)
def _ecma_regex(pattern: str) -> re.Pattern[str]:
    return re.compile(ecma_anchors(pattern))


def _pattern(
    validator: jsonschema.protocols.Validator, pattern: str, instance: Any, schema: Mapping[str, Any]
) -> Iterator[jsonschema.ValidationError]:
    """JSON Schema's ``pattern``, its anchors as ECMA-262 reads them (``ecma_anchors``)."""
    if validator.is_type(instance, "string") and not _ecma_regex(pattern).search(instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


#: The matrix's validator: Draft 2020-12, its ``pattern`` a full match where the pattern says so.
MatrixValidator = jsonschema.validators.extend(jsonschema.Draft202012Validator, validators={"pattern": _pattern})


def _schema() -> JsonObject:
    text = resources.files("harness.config").joinpath("matrix.schema.json").read_text(encoding="utf-8")
    schema: JsonObject = json.loads(text)
    return schema


def _at(value: JsonValue, *keys: str) -> JsonValue:
    """What ``value`` holds under ``keys``, one mapping inside another (None where one is missing)."""
    for key in keys:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def _in_schema(*keys: str) -> JsonValue:
    return _at(_schema(), *keys)


def _keys(value: JsonValue) -> list[str]:
    return list(value) if isinstance(value, Mapping) else []


def _properties(error: jsonschema.ValidationError) -> list[str]:
    """The properties the failing part of the schema allows."""
    schema: JsonValue = error.schema if isinstance(error.schema, Mapping) else {}
    return _keys(_at(schema, "properties"))


def _field(path: Iterable[Any]) -> str:
    return ".".join(str(p) for p in path) or "(top level)"


def _schema_error(path: Path, error: jsonschema.ValidationError) -> UserError:
    where = list(error.absolute_path)
    field = _field(where)
    if error.validator in ("additionalProperties", "unevaluatedProperties"):
        allowed = sorted(_properties(error))
        if error.validator == "unevaluatedProperties":
            allowed = sorted({*allowed, *_keys(_in_schema("$defs", "settings", "properties"))})
        extra = sorted(set(error.instance) - set(allowed)) if isinstance(error.instance, dict) else []
        unknown = extra[0] if extra else "?"
        hint = f"allowed keys here: {', '.join(allowed)}" if allowed else MATRIX_FORMAT_HINT
        return UserError(path, _field([*where, unknown]), f"unknown key {unknown!r}", f"remove or rename it ({hint})")
    if error.validator == "required":
        return UserError(path, field, error.message, f"add it ({MATRIX_FORMAT_HINT})")
    if error.validator == "pattern" or (error.validator == "propertyNames"):
        settings = _in_schema("$defs", "settings", "properties")
        if error.validator_value == _at(settings, "python", "pattern"):
            return UserError(
                path, field, f"{error.instance!r} is not a Python version", "write it like '3.11' or '3.11.9'"
            )
        if error.validator_value == _at(settings, "exclude_packages", "items", "pattern"):
            return UserError(
                path,
                field,
                f"{error.instance!r} is not a package name",
                "write its name on PyPI: letters, digits, '.', '_' and '-', starting and ending with a letter or digit",
            )
        return UserError(
            path,
            field,
            f"{error.instance!r} is not an allowed name",
            "use letters, digits, '.', '_' and '-' only, starting with a letter or digit",
        )
    if error.validator == "const" and where == ["version"]:
        return UserError(
            path, field, f"matrix format version {error.instance!r} is not supported", "write 'version: 1'"
        )
    return UserError(path, field, error.message, f"correct the value ({MATRIX_FORMAT_HINT})")


def _check_specifier(path: Path, field: str, package: str, spec: str) -> str:
    spec = spec.strip()
    if spec == NEWEST:
        return spec  # the newest release, resolved afresh for each run
    try:
        SpecifierSet(spec)
    except InvalidSpecifier:
        fix = (
            f"write a PEP 440 specifier such as '=={_example_version(spec)}' or '>=1.0,<2.0', "
            f"or null to leave {package} out"
        )
        raise UserError(path, field, f"{spec!r} is not a valid PEP 440 version specifier", fix) from None
    if not spec:
        raise UserError(
            path,
            field,
            "an empty specifier would install any version",
            f"pin it (e.g. '==1.2.3'), write '{NEWEST}' for the newest release, or null to leave {package} out",
        )
    return spec


def _example_version(spec: str) -> str:
    digits = "".join(ch if ch.isdigit() or ch == "." else ("." if ch == "," else "") for ch in spec).strip(".")
    return digits or "1.2.3"


#: How close a package name must come to one the harness tracks to be taken for its misspelling.
MISSPELLED_CUTOFF = 0.85


def _check_name(path: Path, field: str, package: str) -> None:
    """A package named all but like one the harness tracks (``deepsped``) is refused: uv would fail to
    find it only when the cell's environment is built, and then as that cell's INFRA."""
    key = canonicalize_name(package)
    if key in TRACKED_PACKAGES:
        return
    close = difflib.get_close_matches(key, TRACKED_PACKAGES, n=1, cutoff=MISSPELLED_CUTOFF)
    if close:
        raise UserError(path, field, f"{package!r} is not a package the harness tracks", f"did you mean {close[0]}?")


def _merge_packages(path: Path, cell_name: str, defaults: dict[str, Any], own: dict[str, Any]) -> dict[str, str]:
    merged: dict[str, str] = {}
    for source, table in (("defaults", defaults), (f"cells.{cell_name}", own)):
        spelled: dict[str, str] = {}
        for package, spec in table.items():
            key = canonicalize_name(package)
            if key in spelled:
                raise UserError(
                    path,
                    f"{source}.packages.{package}",
                    f"names the same package as {spelled[key]!r} ({key})",
                    "keep one of the two spellings",
                )
            spelled[key] = package
            _check_name(path, f"{source}.packages.{package}", package)
            if spec is None:
                merged.pop(key, None)
                continue
            merged[key] = _check_specifier(path, f"{source}.packages.{package}", package, spec)
    return merged


def _exclusions(
    path: Path, cell_name: str, raw: dict[str, Any], defaults: dict[str, Any], packages: dict[str, str]
) -> tuple[str, ...]:
    """The cell's ``exclude_packages`` (its own list replaces the defaults'), canonical names.
    A package both installed and excluded is a contradiction, refused here."""
    source = f"cells.{cell_name}" if "exclude_packages" in raw else "defaults"
    names = raw.get("exclude_packages", defaults.get("exclude_packages")) or []
    excluded: list[str] = []
    for i, name in enumerate(names):
        key = canonicalize_name(name)
        if key in excluded:
            raise UserError(
                path, f"{source}.exclude_packages[{i}]", f"names {key} twice", "keep one of the two spellings"
            )
        if key in packages:
            raise UserError(
                path,
                f"{source}.exclude_packages[{i}]",
                f"excludes {name!r}, which cell {cell_name} installs ({key}{packages[key]})",
                f"remove it from exclude_packages, or set packages.{name}: null in cells.{cell_name}",
            )
        excluded.append(key)
    return tuple(sorted(excluded))


def _check_date(path: Path, field: str, value: str | None) -> str | None:
    if value is None:
        return None
    try:
        dt.datetime.fromisoformat(value)
    except ValueError:
        raise UserError(
            path, field, f"{value!r} is not a date", "write an ISO date such as '2026-06-30' or an RFC 3339 time"
        ) from None
    return value


def read_matrix_file(path: Path) -> bytes:
    """The file's bytes, read as every file a user names is (``harness/core/user_files.py``): at most
    ``MAX_MATRIX_BYTES``, a device or a named pipe that never ends refused within seconds. Read once per
    command and handed to what needs it: a pipe (``--matrix <(command)``) can be read only once."""
    return read_named(path, "", "pass --matrix with the path of a matrix file", limit=MAX_MATRIX_BYTES, what="a matrix")


def _check_repro(
    path: Path, field: str, repro: str, known_repros: Collection[str], broken: Mapping[str, BrokenRepro]
) -> None:
    """A repro the matrix names is one that was found; one whose file could not be read is refused with
    what is wrong with the file (the loader's own message), never as a repro that does not exist."""
    if repro in known_repros:
        return
    unreadable = next((b for b in broken.values() if b.declared_id == repro), None)
    if unreadable is None:
        raise UserError(path, field, f"unknown repro {repro!r}", unknown_repro_fix(repro, known_repros))
    if unreadable.error is not None:
        raise unreadable.error
    raise UserError(unreadable.module, "", unreadable.reason, f"fix it: {path.name}'s {field} names it")


def load_matrix(
    path: Path,
    known_repros: Collection[str],
    known_modes: Collection[str],
    broken: Mapping[str, BrokenRepro] | None = None,
    content: bytes | None = None,
) -> Matrix:
    """Read and validate ``path`` (its bytes ``content`` where they were read already); raise ``UserError``
    naming the field and the fix."""
    broken = broken or {}
    path = Path(path)
    raw_bytes = read_matrix_file(path) if content is None else content
    data = load_yaml(path, raw_bytes)
    if not isinstance(data, dict):
        raise UserError(path, "", "is not a mapping", f"start from the example ({MATRIX_FORMAT_HINT})")

    validator = MatrixValidator(_schema())
    errors = list(validator.iter_errors(data))
    # A property whose value fails its own check is also reported as "unevaluated" by the
    # enclosing schema; that echo names no key of its own: report the real error instead.
    real = [e for e in errors if not _is_echo(e)]
    error = jsonschema.exceptions.best_match(real or errors)
    if error is not None:
        raise _schema_error(path, error)
    _check_numbers(path, data)

    defaults: dict[str, Any] = data.get("defaults") or {}
    cells_raw: dict[str, dict[str, Any]] = data["cells"]
    declared_lanes: dict[str, str] = dict(data.get("lanes") or {})
    for name, cell in cells_raw.items():
        for i, lane in enumerate(cell.get("lanes", [])):
            if lane not in declared_lanes:
                known = (
                    f"or use one of: {', '.join(sorted(declared_lanes))}" if declared_lanes else "(no lane is declared)"
                )
                raise UserError(
                    path,
                    f"cells.{name}.lanes[{i}]",
                    f"unknown lane {lane!r}",
                    f"declare it under 'lanes:' ({lane}: \"what it is for\") {known}",
                )
    lanes = declared_lanes

    cells: dict[str, Cell] = {}
    for name, raw in cells_raw.items():
        packages = _merge_packages(path, name, defaults.get("packages") or {}, raw.get("packages") or {})
        provider = _provider(path, name, raw, defaults)
        if not packages and provider_class(provider).installs_packages:
            raise UserError(
                path,
                f"cells.{name}.packages",
                "the cell installs no packages",
                f"list its packages (or defaults.packages), or name a provider that installs none "
                f"(provider: {PassthroughProvider.name})",
            )
        cell_repros = raw.get("repros")
        for i, repro in enumerate(cell_repros or []):
            _check_repro(path, f"cells.{name}.repros[{i}]", repro, known_repros, broken)
        exclude_newer = raw.get("exclude_newer", defaults.get("exclude_newer"))
        cells[name] = Cell(
            name=name,
            packages=packages,
            lanes=tuple(raw.get("lanes", [])),
            world_size=int(raw.get("world_size", defaults.get("world_size", DEFAULT_WORLD_SIZE))),
            python=str(raw.get("python", defaults.get("python", DEFAULT_PYTHON))),
            timeout_s=float(raw.get("timeout_s", defaults.get("timeout_s", DEFAULT_TIMEOUT_S))),
            exclude_newer=_check_date(path, f"cells.{name}.exclude_newer", exclude_newer),
            provider=provider,
            repros=tuple(cell_repros) if cell_repros is not None else None,
            description=str(raw.get("description", "")),
            model=str(raw.get("model", defaults.get("model", "tiny"))),
            family=str(raw.get("family", defaults.get("family", DEFAULT_FAMILY))),
            prerelease=bool(raw.get("prerelease", defaults.get("prerelease", False))),
            exclude_packages=_exclusions(path, name, raw, defaults, packages),
        )

    excludes: list[Exclude] = []
    for i, raw in enumerate(data.get("exclude") or []):
        # ``cell`` and ``repro`` each name one or a list (one exclusion for each pair, the same reason); a repro
        # whose file could not be read is refused with the loader's own message.
        cell_list = _exclude_names(path, i, raw, "cell", cells, one_of)
        named_repros = raw.get("repro")
        listed: list[str | None] = named_repros if isinstance(named_repros, list) else [named_repros]
        for j, repro in enumerate(listed):
            if repro is not None:
                field = f"exclude[{i}].repro" + (f"[{j}]" if isinstance(named_repros, list) else "")
                _check_repro(path, field, repro, known_repros, broken)
        if "mode" in raw and raw["mode"] not in known_modes:
            raise UserError(
                path, f"exclude[{i}].mode", f"unknown mode {raw['mode']!r}", f"use one of: {', '.join(known_modes)}"
            )
        for cell_name in cell_list:
            for repro in listed:
                excludes.append(Exclude(reason=raw["reason"], cell=cell_name, repro=repro, mode=raw.get("mode")))

    default_lane = data.get("default_lane")
    if default_lane is not None and default_lane not in lanes:
        raise UserError(path, "default_lane", f"unknown lane {default_lane!r}", f"use one of: {', '.join(lanes)}")

    named = data.get("repros")
    for i, repro in enumerate(named or []):
        _check_repro(path, f"repros[{i}]", repro, known_repros, broken)

    return Matrix(
        path=path.resolve(),
        sha256=hashlib.sha256(raw_bytes).hexdigest(),
        cells=cells,
        lanes=lanes,
        default_lane=default_lane,
        excludes=tuple(excludes),
        grid=load_grid(path, data.get("grid"), lanes),
        crosscheck=load_crosscheck(path, data.get("crosscheck"), list(lanes), list(cells)),
        repros=tuple(named) if named else None,
        repros_dirs=_repros_dirs(path, data),
    )


def _exclude_names(
    path: Path,
    index: int,
    raw: dict[str, Any],
    key: str,
    known: Collection[str],
    fix: Callable[[str, Collection[str]], str],
) -> list[str | None]:
    """What exclusion ``index`` names under ``key``: one name or a list (None: every one); an unknown one refused."""
    named = raw.get(key)
    listed: list[str | None] = named if isinstance(named, list) else [named]
    for j, name in enumerate(listed):
        if name is not None and name not in known:
            field = f"exclude[{index}].{key}" + (f"[{j}]" if isinstance(named, list) else "")
            raise UserError(path, field, f"unknown {key} {name!r}", fix(name, known))
    return listed


def _provider(path: Path, cell_name: str, raw: dict[str, Any], defaults: dict[str, Any]) -> str:
    """The cell's provider: its own ``provider:``, else the defaults', else uv; ``passthrough: true``
    is an older way to name the passthrough provider."""
    named = raw.get("provider", defaults.get("provider"))
    where = f"cells.{cell_name}.provider" if "provider" in raw else "defaults.provider"
    if raw.get("passthrough"):
        if named is not None and named != PassthroughProvider.name:
            raise UserError(
                path, f"cells.{cell_name}", f"says both passthrough: true and provider: {named}", "keep one of the two"
            )
        named = PassthroughProvider.name
    if named is None:
        return DEFAULT_PROVIDER
    if named not in PROVIDERS:
        raise UserError(path, where, f"unknown environment provider {named!r}", one_of(named, PROVIDERS))
    return str(named)


def _repros_dirs(path: Path, data: dict[str, Any]) -> tuple[Path, ...]:
    dirs = []
    for i, entry in enumerate(data.get("repros_dirs") or []):
        directory = (path.resolve().parent / Path(entry).expanduser()).resolve()
        if not is_directory(directory):
            raise UserError(
                path,
                f"repros_dirs[{i}]",
                f"{entry!r} is not a directory ({directory})",
                "name a directory of repro files, relative to the matrix file",
            )
        dirs.append(directory)
    return tuple(dirs)


def declared_repros_dirs(path: Path, content: bytes | None = None) -> tuple[Path, ...]:
    """The matrix's ``repros_dirs`` (from its bytes ``content`` where they were read already), read before its
    repros are known (they are where some come from). A matrix that cannot be read gives none here:
    ``load_matrix`` then says what is wrong."""
    try:
        data = load_yaml(path, read_matrix_file(Path(path)) if content is None else content)
    except (OSError, UserError):
        return ()
    if not isinstance(data, dict) or not isinstance(data.get("repros_dirs"), list):
        return ()
    if not all(isinstance(entry, str) and entry for entry in data["repros_dirs"]):
        return ()
    return _repros_dirs(Path(path), data)
