"""The one registry type: the named extensions of one kind (launchers, executors, environment
providers, report writers, verbs, repro kinds, meters, guards, grid axes, model families...).

A registry holds its built-in entries, what installed packages declare under its entry-point group
(``ft_regress.launchers``, ``ft_regress.executors``, ``ft_regress.providers``, ``ft_regress.repros``...,
in a package's ``pyproject.toml``: ``[project.entry-points."ft_regress.executors"] mine =
"my_pkg.executor:MyExecutor"``), and what code registers while it runs (``REGISTRY[name] = value``; a
test's ``monkeypatch.setitem``). It is read whenever it is used, never copied at import, so a
package installed or an entry registered later counts like a built-in one. An entry is loaded
(imported) only when it is asked for by name: a built-in may be given as ``"module:attribute"``
(``lazy``) so that choosing it is what imports it (``ray`` is imported only by ``--executor ray``).

Two installed packages, or a package and a built-in, giving one name is refused with one line
naming both (``RegistryClash``), never one silently shadowing the other. An entry registered at run
time stands over one of the same name (that is what registering it asks for).

Standard library only: both sides of the process boundary use it (the worker side's registries are
read inside a cell's environment).
"""

from __future__ import annotations

import importlib
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, EntryPoints, entry_points
from typing import Generic, TypeVar, cast

T = TypeVar("T")


class RegistryClash(Exception):
    """Two extensions of one kind are named alike. ``str()`` is the one line to print (exit 2)."""

    def __init__(self, kind: str, group: str, name: str, first: str, second: str) -> None:
        self.kind = kind
        self.name = name
        super().__init__(
            f"entry point group {group}: two {kind}s are named {name!r} ({first}; {second}); "
            "uninstall one of the packages, or have one register its entry under another name"
        )


@dataclass(frozen=True)
class Lazy:
    """A built-in entry named by where it is (``module:attribute``), imported when it is asked for."""

    ref: str

    def load(self) -> object:
        module, _, attribute = self.ref.partition(":")
        value: object = importlib.import_module(module)
        for part in filter(None, attribute.split(".")):
            value = getattr(value, part)
        return value


def lazy(ref: str) -> Lazy:
    return Lazy(ref)


_scan_lock = threading.Lock()
_scanned: dict[tuple[str, tuple[str, ...]], EntryPoints] = {}


def _installed(group: str) -> EntryPoints:
    """The installed distributions' entry points of ``group``, read once per import path (``sys.path``)."""
    key = (group, tuple(sys.path))
    with _scan_lock:
        if key not in _scanned:
            _scanned[key] = entry_points(group=group)
        return _scanned[key]


def _distribution(point: EntryPoint) -> str:
    dist = point.dist
    return f"{dist.name} {dist.version}" if dist is not None else "an installed package"


class Registry(MutableMapping[str, T], Generic[T]):
    """Named entries of one kind: the built-ins, an entry-point group's, and those registered at run time."""

    def __init__(
        self,
        kind: str,
        builtins: Mapping[str, T | Lazy] | None = None,
        group: str | None = None,
        load: Callable[[EntryPoint], T] | None = None,
    ) -> None:
        #: What one entry is, in words ("executor", "environment provider").
        self.kind = kind
        #: The entry-point group installed packages declare entries under; None: code only.
        self.group = group
        self._builtins: dict[str, T | Lazy] = dict(builtins or {})
        self._registered: dict[str, T] = {}
        self._load = load
        self._loaded: dict[tuple[str, str], T] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ what is declared

    def installed(self) -> dict[str, EntryPoint]:
        """The group's entry points of the installed packages, by name; a ``RegistryClash`` where two
        packages, or a package and a built-in entry, give one name."""
        if self.group is None:
            return {}
        found: dict[str, EntryPoint] = {}
        for point in _installed(self.group):
            if point.name in self._builtins:
                raise RegistryClash(
                    self.kind,
                    self.group,
                    point.name,
                    "built into ft-regress",
                    f"{point.value} from {_distribution(point)}",
                )
            earlier = found.get(point.name)
            if earlier is not None and earlier.value != point.value:
                raise RegistryClash(
                    self.kind,
                    self.group,
                    point.name,
                    f"{earlier.value} from {_distribution(earlier)}",
                    f"{point.value} from {_distribution(point)}",
                )
            found[point.name] = point
        return found

    def names(self) -> list[str]:
        """Every name, in order: the built-ins, the installed packages' (by name), those registered."""
        installed = self.installed()
        ordered = [*self._builtins, *sorted(installed)]
        return [*ordered, *(name for name in self._registered if name not in ordered)]

    def origin(self, name: str) -> str:
        """Where ``name`` comes from, in words."""
        if name in self._registered:
            return "registered at run time"
        if name in self._builtins:
            return "built in"
        point = self.installed().get(name)
        if point is None:
            raise KeyError(name)
        return f"{point.value} from {_distribution(point)} (entry point group {self.group})"

    # ------------------------------------------------------------------ the mapping

    def __getitem__(self, name: str) -> T:
        if name in self._registered:
            return self._registered[name]
        if name in self._builtins:
            entry = self._builtins[name]
            if isinstance(entry, Lazy):
                return self._cached(("builtin", entry.ref), lambda: cast(T, entry.load()))
            return entry
        point = self.installed().get(name)
        if point is None:
            raise KeyError(name)
        loader = self._load
        return self._cached((point.value, point.name), lambda: loader(point) if loader else cast(T, point.load()))

    def _cached(self, key: tuple[str, str], load: Callable[[], T]) -> T:
        with self._lock:
            if key in self._loaded:
                return self._loaded[key]
        value = load()
        with self._lock:
            return self._loaded.setdefault(key, value)

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        return name in self._registered or name in self._builtins or name in self.installed()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __setitem__(self, name: str, value: T) -> None:
        self._registered[name] = value

    def __delitem__(self, name: str) -> None:
        del self._registered[name]

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()!r})"
