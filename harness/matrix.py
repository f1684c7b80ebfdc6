"""matrix.yaml: load, validate against the schema, and resolve cells.

A cell inherits ``defaults`` and overrides what it names; a package set to ``null``
is not installed. Nothing here depends on a cell's name.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name

from harness.errors import UserError
from harness.suggest import one_of, unknown_repro_fix

DEFAULT_WORLD_SIZE = 2
DEFAULT_PYTHON = "3.11"
DEFAULT_TIMEOUT_S = 600.0
MATRIX_FORMAT_HINT = "see 'matrix.yaml format' in the README"


@dataclass(frozen=True)
class Cell:
    name: str
    packages: dict[str, str]
    lanes: tuple[str, ...]
    world_size: int
    python: str
    timeout_s: float
    exclude_newer: str | None
    passthrough: bool
    repros: tuple[str, ...] | None
    description: str = ""
    #: The matrix cell this one was derived from (by --pin or bisect), if any.
    origin: str | None = None
    #: The test model's size (``repros/common/tiny_models.py``): ``tiny`` or ``small``.
    model: str = "tiny"
    #: Packages kept out of the environment even where a dependency asks for them
    #: (canonical names; uv's ``--excludes``).
    exclude_packages: tuple[str, ...] = ()

    @property
    def provider(self) -> str:
        """Which environment provider builds or finds this cell's interpreter."""
        return "passthrough" if self.passthrough else "uv"


@dataclass(frozen=True)
class Exclude:
    reason: str
    cell: str | None = None
    repro: str | None = None
    mode: str | None = None

    def covers(self, cell: str, repro: str, mode: str) -> bool:
        return (
            (self.cell is None or self.cell == cell)
            and (self.repro is None or self.repro == repro)
            and (self.mode is None or self.mode == mode)
        )


@dataclass(frozen=True)
class Matrix:
    path: Path
    sha256: str
    cells: dict[str, Cell]
    lanes: dict[str, str]
    default_lane: str | None
    excludes: tuple[Exclude, ...]
    #: The config grid (``harness/grid.py``), where the matrix declares one.
    grid: Any = None
    #: The repros this matrix is about (``repros:``): what ``--repros`` defaults to. None: every repro.
    repros: tuple[str, ...] | None = None
    #: Directories of the user's repro files (``repros_dirs:``, relative to the matrix), absolute.
    repros_dirs: tuple[Path, ...] = ()

    def cells_in_lane(self, lane: str) -> list[Cell]:
        if lane not in self.lanes:
            known = ", ".join(sorted(self.lanes)) or "(none)"
            raise UserError(self.path, "lanes", f"no lane named {lane!r}", f"pick one of: {known}")
        return [c for c in self.cells.values() if lane in c.lanes]

    def exclusion(self, cell: str, repro: str, mode: str) -> Exclude | None:
        return next((e for e in self.excludes if e.covers(cell, repro, mode)), None)


class _UniqueKeyLoader(yaml.SafeLoader):
    """A YAML loader that refuses a key written twice in one mapping (PyYAML keeps the last)."""


def _construct_unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} appears twice (first on line {seen[key] + 1})", key_node.start_mark
            )
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)


#: A matrix is a few kilobytes; anything far larger is a mistake or an attack.
MAX_MATRIX_BYTES = 1 << 20
#: Per-item timeouts above a week are typos (and ``.inf`` is no timeout at all).
MAX_TIMEOUT_S = 7 * 24 * 3600.0


#: The most values a matrix may expand to, its YAML aliases followed: a real one has a few hundred.
MAX_EXPANDED_VALUES = 100_000


def _refuse_alias_bombs(path: Path, raw: bytes) -> None:
    """YAML aliases may share a value (a generated matrix does, for twin cells), but a few
    lines of aliases to aliases expand to billions of values (a 'billion laughs'), which
    validating or printing would follow: count the expanded values first and refuse that."""
    root = yaml.compose(raw, Loader=yaml.SafeLoader)
    if root is None:
        return
    sizes: dict[int, int] = {}

    def expanded(node: yaml.Node) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        sizes[id(node)] = 1  # a recursive alias counts once: it cannot be followed forever
        if isinstance(node, yaml.SequenceNode):
            total = 1 + sum(expanded(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total = 1 + sum(expanded(k) + expanded(v) for k, v in node.value)
        else:
            total = 1
        sizes[id(node)] = total
        return total

    total = expanded(root)
    if total > MAX_EXPANDED_VALUES:
        raise UserError(
            path,
            f"line {root.start_mark.line + 1}",
            f"expands to {total} values through its YAML aliases",
            "write the values out, or share less (what every cell shares goes under 'defaults:')",
        )


def _is_echo(error: jsonschema.ValidationError) -> bool:
    if error.validator not in ("additionalProperties", "unevaluatedProperties") or not isinstance(error.instance, dict):
        return False
    allowed = set(error.schema.get("properties", {}))
    if error.validator == "unevaluatedProperties":
        allowed |= set(_schema()["$defs"]["settings"]["properties"])
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


def _schema() -> dict[str, Any]:
    text = resources.files("harness").joinpath("matrix.schema.json").read_text(encoding="utf-8")
    return json.loads(text)


def _field(path: Iterable[Any]) -> str:
    return ".".join(str(p) for p in path) or "(top level)"


def _schema_error(path: Path, error: jsonschema.ValidationError) -> UserError:
    where = list(error.absolute_path)
    field = _field(where)
    if error.validator in ("additionalProperties", "unevaluatedProperties"):
        allowed = sorted(error.schema.get("properties", {}))
        if error.validator == "unevaluatedProperties":
            allowed = sorted({*allowed, *_schema()["$defs"]["settings"]["properties"]})
        extra = sorted(set(error.instance) - set(allowed)) if isinstance(error.instance, dict) else []
        unknown = extra[0] if extra else "?"
        hint = f"allowed keys here: {', '.join(allowed)}" if allowed else MATRIX_FORMAT_HINT
        return UserError(path, _field([*where, unknown]), f"unknown key {unknown!r}", f"remove or rename it ({hint})")
    if error.validator == "required":
        return UserError(path, field, error.message, f"add it ({MATRIX_FORMAT_HINT})")
    if error.validator == "pattern" or (error.validator == "propertyNames"):
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
            f"pin it (e.g. '==1.2.3'), or write null to leave {package} out",
        )
    return spec


def _example_version(spec: str) -> str:
    digits = "".join(ch if ch.isdigit() or ch == "." else ("." if ch == "," else "") for ch in spec).strip(".")
    return digits or "1.2.3"


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


def load_matrix(path: Path, known_repros: Collection[str], known_modes: Collection[str]) -> Matrix:
    """Read and validate ``path``; raise ``UserError`` naming the field and the fix."""
    path = Path(path)
    try:
        raw_bytes = path.read_bytes()
    except FileNotFoundError:
        raise UserError(path, "", "no such matrix file", "pass --matrix with the path of an existing file") from None
    except OSError as exc:
        raise UserError(path, "", f"cannot be read ({exc.strerror})", "check the path and its permissions") from None
    if len(raw_bytes) > MAX_MATRIX_BYTES:
        raise UserError(
            path, "", f"is {len(raw_bytes)} bytes, more than a matrix needs", f"keep it under {MAX_MATRIX_BYTES} bytes"
        )
    try:
        _refuse_alias_bombs(path, raw_bytes)
        data = yaml.load(raw_bytes, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f"line {mark.line + 1}" if mark else "somewhere"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UserError(path, line, f"is not valid YAML ({problem})", "fix the syntax there") from None
    if not isinstance(data, dict):
        raise UserError(path, "", "is not a mapping", f"start from the example in the README ({MATRIX_FORMAT_HINT})")

    validator = jsonschema.Draft202012Validator(_schema())
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
                known = f"or use one of: {', '.join(sorted(declared_lanes))}" if declared_lanes else "(no lane is declared)"
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
        passthrough = bool(raw.get("passthrough", False))
        if not packages and not passthrough:
            raise UserError(
                path,
                f"cells.{name}.packages",
                "the cell installs no packages",
                "list its packages (or defaults.packages), or set 'passthrough: true'",
            )
        cell_repros = raw.get("repros")
        for i, repro in enumerate(cell_repros or []):
            if repro not in known_repros:
                raise UserError(
                    path, f"cells.{name}.repros[{i}]", f"unknown repro {repro!r}",
                    unknown_repro_fix(repro, known_repros),
                )
        exclude_newer = raw.get("exclude_newer", defaults.get("exclude_newer"))
        cells[name] = Cell(
            name=name,
            packages=packages,
            lanes=tuple(raw.get("lanes", [])),
            world_size=int(raw.get("world_size", defaults.get("world_size", DEFAULT_WORLD_SIZE))),
            python=str(raw.get("python", defaults.get("python", DEFAULT_PYTHON))),
            timeout_s=float(raw.get("timeout_s", defaults.get("timeout_s", DEFAULT_TIMEOUT_S))),
            exclude_newer=_check_date(path, f"cells.{name}.exclude_newer", exclude_newer),
            passthrough=passthrough,
            repros=tuple(cell_repros) if cell_repros is not None else None,
            description=str(raw.get("description", "")),
            model=str(raw.get("model", defaults.get("model", "tiny"))),
            exclude_packages=_exclusions(path, name, raw, defaults, packages),
        )

    excludes: list[Exclude] = []
    for i, raw in enumerate(data.get("exclude") or []):
        if "cell" in raw and raw["cell"] not in cells:
            raise UserError(path, f"exclude[{i}].cell", f"unknown cell {raw['cell']!r}", one_of(raw["cell"], cells))
        if "repro" in raw and raw["repro"] not in known_repros:
            raise UserError(
                path, f"exclude[{i}].repro", f"unknown repro {raw['repro']!r}",
                unknown_repro_fix(raw["repro"], known_repros),
            )
        if "mode" in raw and raw["mode"] not in known_modes:
            raise UserError(
                path, f"exclude[{i}].mode", f"unknown mode {raw['mode']!r}", f"use one of: {', '.join(known_modes)}"
            )
        excludes.append(
            Exclude(reason=raw["reason"], cell=raw.get("cell"), repro=raw.get("repro"), mode=raw.get("mode"))
        )

    default_lane = data.get("default_lane")
    if default_lane is not None and default_lane not in lanes:
        raise UserError(path, "default_lane", f"unknown lane {default_lane!r}", f"use one of: {', '.join(lanes)}")

    named = data.get("repros")
    for i, repro in enumerate(named or []):
        if repro not in known_repros:
            raise UserError(path, f"repros[{i}]", f"unknown repro {repro!r}", unknown_repro_fix(repro, known_repros))

    from harness.grid import load_grid

    return Matrix(
        path=path.resolve(),
        sha256=hashlib.sha256(raw_bytes).hexdigest(),
        cells=cells,
        lanes=lanes,
        default_lane=default_lane,
        excludes=tuple(excludes),
        grid=load_grid(path, data.get("grid"), lanes),
        repros=tuple(named) if named else None,
        repros_dirs=_repros_dirs(path, data),
    )


def _repros_dirs(path: Path, data: dict[str, Any]) -> tuple[Path, ...]:
    dirs = []
    for i, entry in enumerate(data.get("repros_dirs") or []):
        directory = (path.resolve().parent / Path(entry).expanduser()).resolve()
        if not directory.is_dir():
            raise UserError(
                path, f"repros_dirs[{i}]", f"{entry!r} is not a directory ({directory})",
                "name a directory of repro files, relative to the matrix file",
            )
        dirs.append(directory)
    return tuple(dirs)


def declared_repros_dirs(path: Path) -> tuple[Path, ...]:
    """The matrix's ``repros_dirs``, read before its repros are known (they are where some come
    from). A matrix that cannot be read gives none here: ``load_matrix`` then says what is wrong."""
    try:
        raw = Path(path).read_bytes()
        if len(raw) > MAX_MATRIX_BYTES:
            return ()
        _refuse_alias_bombs(path, raw)
        data = yaml.load(raw, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except (OSError, yaml.YAMLError, UserError):
        return ()
    if not isinstance(data, dict) or not isinstance(data.get("repros_dirs"), list):
        return ()
    if not all(isinstance(entry, str) and entry for entry in data["repros_dirs"]):
        return ()
    return _repros_dirs(Path(path), data)
