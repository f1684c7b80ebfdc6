"""Options defined once, for the command line and the pytest plugin alike.

Each ``Option`` names its destination, its flags, its help and how its value is read; the CLI
verbs (``harness/cli/commands``) and the pytest plugin (``harness/pytest_plugin.py``) add the
ones they take from this table, and ``selection`` turns the values into ``RunOptions``. Under
pytest, an option whose CLI flag is too generic for a pytest session that loads many plugins
(``--out``, ``--launcher``) has a ``repro-`` prefixed flag instead (``pytest_flags``).

Where the matrix comes from: ``--matrix``, else ``./matrix.yaml``, else ``$FT_REGRESS_MATRIX``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.config.locate import DEFAULT_MATRIX_NAME, MATRIX_VARIABLE, find_matrix
from harness.config.matrix import Matrix, declared_repros_dirs, load_matrix
from harness.config.repros import Discovery, discover
from harness.core.errors import UserError
from harness.environments import default_cache_dir
from harness.execution.launchers import LAUNCHERS, default_launcher
from harness.pipeline.executors import CHECKS, EXECUTORS, NEEDS
from harness.planning.items import RunOptions
from repros.runtime.families import FAMILIES
from repros.runtime.spec import MODES


@dataclass(frozen=True)
class Option:
    dest: str
    flags: tuple[str, ...]
    help: str
    #: ``text``, ``csv`` (comma-separated, repeatable), ``path``, ``paths`` (repeatable), ``choice``, ``int``,
    #: ``date`` (YYYY-MM-DD, up to today), ``gb`` (a size in GB, more than 0).
    kind: str = "text"
    #: What it accepts: a fixed tuple, or a registry read when the value is checked (a later
    #: registration counts).
    choices: Collection[str] = ()
    default: Callable[[], Any] | None = None
    metavar: str | None = None
    #: The flags under pytest, where they differ from ``flags``.
    pytest_flags: tuple[str, ...] | None = None
    #: ``int``: the least value it takes (its message says so).
    minimum: int = 0

    def argparse_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"dest": self.dest, "help": self.help}
        if self.metavar:
            kwargs["metavar"] = self.metavar
        if self.kind in ("csv", "paths"):
            kwargs["action"] = "append"
            kwargs["default"] = []
        if self.kind in ("path", "paths"):
            kwargs["type"] = path_value
        if self.kind == "int":
            kwargs["type"] = whole_number(self.flags[0], self.minimum)
        if self.kind == "date":
            kwargs["type"] = _past_day(self.flags[0])
        if self.kind == "gb":
            kwargs["type"] = gigabytes(self.flags[0])
        if self.kind == "choice":
            kwargs["choices"] = self.choices
        if self.default is not None and self.kind not in ("csv", "paths"):
            kwargs["default"] = self.default()
        return kwargs


def _past_day(flag: str) -> Callable[[str], str]:
    def parse(value: str) -> str:
        try:
            day = dt.date.fromisoformat(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} takes a day, YYYY-MM-DD, not {value!r}") from None
        if day > dt.date.today():
            raise argparse.ArgumentTypeError(f"{flag} {value} is in the future: give a day up to today")
        return day.isoformat()

    return parse


#: The longest name one directory entry may have, and the longest path (Linux's NAME_MAX, PATH_MAX).
NAME_MAX = 255
PATH_MAX = 4096
#: Room kept under an output directory for what a run writes there (cells, items, attempts, logs).
OUTPUT_ROOM = 1024


def path_problem(path: Path, room: int = 0) -> str | None:
    """What makes ``path`` unusable as a path at all (empty, a part longer than a file system
    allows, too long with ``room`` bytes more below it), or None. Nothing is looked up: a name too
    long would make every look-up raise."""
    text = str(path)
    if not text or text.isspace():
        return "is empty"
    if "\0" in text:
        return "holds a NUL character"
    for part in Path(text).parts:
        if len(os.fsencode(part)) > NAME_MAX:
            return f"has a part of {len(os.fsencode(part))} bytes, more than a file name may have ({NAME_MAX})"
    full = len(os.fsencode(os.path.abspath(text)))
    if full + room >= PATH_MAX:
        kept = f" with room for what goes under it ({room} bytes)" if room else ""
        return f"is {full} bytes long, more than a path may be{kept} ({PATH_MAX})"
    return None


def path_value(value: str) -> Path:
    """argparse's type for a path argument: refused as it is parsed where it could not be a path
    (argparse names the argument)."""
    problem = path_problem(Path(value)) if value else "is empty"
    if problem:
        raise argparse.ArgumentTypeError(f"{shown(value)} {problem}")
    return Path(value)


def shown(value: str, limit: int = 60) -> str:
    """A value as an error message shows it: quoted, escaped, and cut short where it is long."""
    quoted = repr(value)
    return quoted if len(quoted) <= limit else f"{quoted[: limit - 5]}...{quoted[-4:]} ({len(value)} characters)"


def check_path(flag: str, path: Path, room: int = 0) -> Path:
    """``path``, or the ``UserError`` naming ``flag`` where it could not be a path."""
    problem = path_problem(path, room)
    if problem:
        raise UserError(flag, shown(str(path)), problem, f"give {flag} another path")
    return path


def check_output_dir(flag: str, path: Path, writable: bool = True) -> Path:
    """A directory a run writes into (or makes): refused up front where it is a file, where what
    it would be made in is not a directory, or (``writable``) where it cannot be written."""
    check_path(flag, path, room=OUTPUT_ROOM)
    target = Path(path).expanduser().absolute()
    existing = target
    while not os.path.lexists(existing) and existing.parent != existing:
        existing = existing.parent
    if os.path.exists(existing) and not os.path.isdir(existing):
        why = "it is not a directory" if existing == target else f"{existing} is not a directory"
        raise UserError(path, flag, f"cannot be written ({why})", f"give {flag} a directory, or where to make one")
    if writable and not os.access(existing, os.W_OK | os.X_OK):
        why = "permission denied" if existing == target else f"{existing} cannot be written"
        raise UserError(path, flag, f"cannot be written ({why})", f"give {flag} a directory you can write to")
    return path


def gigabytes(flag: str) -> Callable[[str], float]:
    def parse(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            number = -1.0
        if not 0 < number < 1e6:
            raise argparse.ArgumentTypeError(f"{flag} takes a size in GB greater than 0, not {value!r}")
        return number

    return parse


def whole_number(flag: str, minimum: int = 0) -> Callable[[str], int]:
    """A parser of whole numbers from ``minimum`` up, whose refusal says what it takes."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            number = minimum - 1
        if number < minimum:
            raise argparse.ArgumentTypeError(f"{flag} takes a whole number ({minimum} or more), not {value!r}")
        return number

    return parse


OPTIONS: dict[str, Option] = {
    o.dest: o
    for o in (
        Option(
            "matrix",
            ("--matrix",),
            f"matrix file (default: ./{DEFAULT_MATRIX_NAME}, else ${MATRIX_VARIABLE})",
            kind="path",
        ),
        Option("lane", ("--lane",), "run the cells of this lane (default: the matrix's default_lane)"),
        Option(
            "cells",
            ("--cells",),
            "cell names, comma-separated (repeatable)",
            kind="csv",
            pytest_flags=("--cells", "--cell"),
        ),
        Option(
            "repros",
            ("--repros",),
            "repro ids, comma-separated, e.g. F1,F5 (default: all, or the matrix's own)",
            kind="csv",
        ),
        Option("modes", ("--modes",), f"modes, comma-separated (default: {','.join(MODES)})", kind="csv"),
        Option(
            "repros_dir",
            ("--repros-dir",),
            "also load the repro files in DIR (repeatable; also $FT_REGRESS_REPROS)",
            kind="paths",
            metavar="DIR",
        ),
        Option(
            "out",
            ("--out",),
            "the run's output directory (default: <reports dir>/<run-id>)",
            kind="path",
            pytest_flags=("--repro-out",),
        ),
        Option("cache_dir", ("--cache-dir",), f"environment cache (default: {default_cache_dir()})", kind="path"),
        Option(
            "cache_max_gb",
            ("--cache-max-gb",),
            "the environment cache's budget in GB: before a build, the least recently used environments not "
            "in use are removed to fit (default: $FT_REGRESS_CACHE_MAX_GB, else half of what the cache and the "
            "free space of its disk come to)",
            kind="gb",
            metavar="GB",
        ),
        Option(
            "launcher",
            ("--launcher",),
            "worker: fork each item's ranks from the cell's pre-imported worker "
            "(default, or $FT_REGRESS_LAUNCHER); torchrun: a bare torchrun per item",
            kind="choice",
            choices=LAUNCHERS,
            pytest_flags=("--repro-launcher",),
        ),
        Option(
            "jobs",
            ("--jobs",),
            "run up to N items at once where the cores, memory and GPUs allow it (default 1; 0: as many as fit)",
            kind="int",
            metavar="N",
        ),
        Option(
            "executor",
            ("--executor",),
            "where items run: local (this machine, default), ray (one Ray task per item on the cluster at "
            "--ray-address, else a local one), slurm (submitit job arrays, one per cell)",
            kind="choice",
            choices=EXECUTORS,
            pytest_flags=("--repro-executor",),
        ),
        Option(
            "ray_address",
            ("--ray-address",),
            "with --executor ray: the address of a running Ray cluster (host:port, or 'auto'); default: start a "
            "local one for the run",
            metavar="ADDR",
        ),
        Option(
            "slurm_folder",
            ("--slurm-folder",),
            "with --executor slurm: where submitit keeps its jobs' files, a folder every node sees (default: "
            "the run directory's 'slurm')",
            kind="path",
        ),
        Option(
            "slurm_param",
            ("--slurm-param",),
            "with --executor slurm: submitit parameters NAME=VALUE, comma-separated (repeatable; e.g. "
            "slurm_partition=gpu,timeout_min=60, or cluster=local for submitit's local executor)",
            kind="csv",
            metavar="NAME=VALUE",
        ),
        Option(
            "reruns",
            ("--reruns",),
            "run an item again, up to N times, while its outcome contradicts its "
            "expectation; every attempt is kept, and one that matches on a rerun is reported flaky (default 0)",
            kind="int",
            metavar="N",
        ),
        Option(
            "as_of",
            ("--as-of",),
            "resolve floating specs (ranges, ~=, *) to what was released before this day; exact pins stay as "
            "written (default: now)",
            kind="date",
            metavar="YYYY-MM-DD",
        ),
        Option(
            "repeat",
            ("--repeat",),
            "run every selected item N times, each attempt recorded: per item the count of each outcome, "
            "and FLAKY where the attempts disagree (default 1)",
            kind="int",
            metavar="N",
            minimum=1,
        ),
        Option(
            "reports_dir",
            ("--reports-dir",),
            "where run directories go (default: reports)",
            kind="path",
            default=lambda: Path("reports"),
        ),
        Option(
            "model",
            ("--model",),
            "the test model's size for every selected cell: tiny (correctness) or small "
            "(measuring; tens of millions of parameters); default: each cell's own (matrix 'model:')",
            kind="choice",
            choices=("tiny", "small"),
            pytest_flags=("--repro-model",),
        ),
        Option(
            "world_size",
            ("--world-size",),
            "launch every selected cell's items with N ranks instead of the cell's own world size (a repro that "
            "fixes its own keeps it; one whose failure cannot occur at N is excluded, saying why)",
            kind="int",
            metavar="N",
            pytest_flags=("--repro-world-size",),
        ),
        Option(
            "family",
            ("--family",),
            "the model families to run every selected cell in, comma-separated (qwen2, llama, mistral, gemma2, "
            "phi3, qwen2-moe, llava); a cell in another family than its own runs as <cell>@<family>; default: each "
            "cell's own (matrix 'family:', else qwen2)",
            kind="csv",
            metavar="FAMILIES",
            pytest_flags=("--repro-family",),
        ),
    )
}


def add_cli_options(parser: argparse.ArgumentParser, names: Iterable[str]) -> None:
    for name in names:
        option = OPTIONS[name]
        parser.add_argument(*option.flags, **option.argparse_kwargs())


def add_pytest_options(group: Any, names: Iterable[str]) -> None:
    """Add the options to a pytest option group, with the ``ft_`` prefix on each destination."""
    for name in names:
        option = OPTIONS[name]
        kwargs = option.argparse_kwargs()
        kwargs["dest"] = f"ft_{option.dest}"
        if "type" in kwargs and option.kind in ("path", "paths"):
            kwargs.pop("type")  # pytest paths are resolved against the invocation directory by the plugin
        group.addoption(*(option.pytest_flags or option.flags), **kwargs)


def csv(values: Sequence[str] | str | None) -> tuple[str, ...]:
    """Comma-separated values, from one string or several (a repeated option)."""
    if values is None:
        return ()
    if isinstance(values, str):
        values = [values]
    # Only spaces are trimmed ("F1, F5"): any other character is part of the name, and a name
    # with a newline or a tab in it is unknown, not taken for the name without it.
    return tuple(v.strip(" ") for value in values for v in value.split(",") if v.strip(" "))


def check_repros_dirs(repros_dirs: Sequence[Path]) -> list[Path]:
    for directory in repros_dirs:
        check_path("--repros-dir", Path(directory))
        if not Path(directory).is_dir():
            raise UserError(directory, "--repros-dir", "is not a directory", "pass the directory of your repro files")
    return [Path(d).resolve() for d in repros_dirs]


def load(matrix: Path | None, repros_dirs: Sequence[Path] = (), cwd: Path | None = None) -> tuple[Matrix, Discovery]:
    """The matrix and the repros it can name (built-in, ``--repros-dir``, the matrix's ``repros_dirs``
    and ``$FT_REGRESS_REPROS``)."""
    given = check_repros_dirs(repros_dirs)
    path = find_matrix(matrix, cwd)
    discovery = discover([*given, *declared_repros_dirs(path)])
    return load_matrix(path, known_repros=discovery.repros.keys(), known_modes=MODES), discovery


def cache_dir(value: Path | None, for_writing: bool = False) -> Path:
    """The environment cache: ``--cache-dir``, else ``$FT_REGRESS_CACHE`` or the default; refused at
    once where it cannot be a directory (else every item would find no environment), and where a
    run (``for_writing``) could not write it."""
    if value is not None:
        flag = "--cache-dir"
    else:
        flag = "$FT_REGRESS_CACHE" if os.environ.get("FT_REGRESS_CACHE") else "the environment cache"
    path = Path(value or default_cache_dir()).expanduser()
    check_output_dir(flag, path, writable=for_writing)
    return path.resolve()


def executor_fields(values: Mapping[str, Any]) -> dict[str, Any]:
    """``--executor`` and its options, checked: a cluster executor's package is installed, and an
    option of one executor is not given to another."""
    name = values.get("executor") or "local"
    if name in NEEDS:
        package, extra = NEEDS[name]
        try:
            __import__(package)
        except ImportError:
            raise UserError(
                "--executor",
                name,
                f"needs the '{package}' package, which is not installed",
                f"pip install 'ft-regress[{extra}]' (or: pip install {package})",
            ) from None
    if values.get("ray_address") and name != "ray":
        raise UserError("--ray-address", values["ray_address"], "is for --executor ray", "add --executor ray")
    for option, flag in (("slurm_folder", "--slurm-folder"), ("slurm_param", "--slurm-param")):
        if values.get(option) and name != "slurm":
            raise UserError(flag, str(values[option]), "is for --executor slurm", "add --executor slurm")
    parameters = []
    for entry in csv(values.get("slurm_param")):
        key, sep, value = entry.partition("=")
        if not sep or not key.strip():
            raise UserError("--slurm-param", entry, "is not NAME=VALUE", "e.g. --slurm-param slurm_partition=gpu")
        parameters.append((key.strip(), value.strip()))
    folder = values.get("slurm_folder")
    fields = {
        "executor": name,
        "ray_address": values.get("ray_address"),
        "slurm_folder": Path(folder).resolve() if folder else None,
        "slurm_parameters": tuple(parameters),
    }
    check = CHECKS.get(name)
    if check is not None:
        check(fields)  # before anything runs: an address nothing answers at, a cluster that is not there
    return fields


def selection(values: Mapping[str, Any], cwd: Path | None = None, **more: Any) -> RunOptions:
    """``RunOptions`` from option values by destination (the CLI's namespace, or the plugin's)."""
    repros_dirs = tuple(Path(d).resolve() for d in check_repros_dirs(values.get("repros_dir") or []))
    if values.get("matrix") is not None:
        check_path("--matrix", Path(values["matrix"]))
    if more.get("out_dir") is not None:
        check_output_dir("--out", Path(more["out_dir"]))
    if values.get("reports_dir") is not None and more.get("out_dir") is None and values.get("out") is None:
        check_output_dir("--reports-dir", Path(values["reports_dir"]))  # where the run's directory is made
    matrix, discovery = load(values.get("matrix"), repros_dirs, cwd)
    given_cache = values.get("cache_dir")
    fields: dict[str, Any] = {
        "matrix": matrix,
        "discovery": discovery,
        "lane": values.get("lane"),
        "cells": csv(values.get("cells")),
        "repros": csv(values.get("repros")),
        "modes": csv(values.get("modes")) or MODES,
        "cache_dir": cache_dir(given_cache, for_writing=True),
        "cache_dir_given": given_cache is not None,
        "cache_max_gb": values.get("cache_max_gb"),
        "repros_dirs": repros_dirs,
    }
    fields["model"] = values.get("model")
    if values.get("world_size") == 0:
        raise UserError("--world-size", "0", "launches no rank", "pass 1 or more (the number of ranks of each item)")
    fields["world_size"] = values.get("world_size")
    fields["families"] = csv(values.get("family"))
    for family in fields["families"]:
        if family not in FAMILIES:
            raise UserError("--family", family, "unknown model family", f"use one of: {', '.join(FAMILIES)}")
    fields["launcher"] = values.get("launcher") or default_launcher()
    fields["jobs"] = 1 if values.get("jobs") is None else values["jobs"]
    fields.update(executor_fields(values))
    fields["reruns"] = values.get("reruns") or 0
    fields["as_of"] = values.get("as_of")
    if values.get("repeat") == 0:
        raise UserError("--repeat", "0", "runs nothing", "pass 1 or more (the number of times each item runs)")
    fields["repeat"] = values.get("repeat") or 1
    if fields["reruns"] and fields["repeat"] > 1:
        raise UserError(
            "--repeat",
            str(fields["repeat"]),
            "cannot be combined with --reruns",
            "--repeat runs every item N times; --reruns runs again only what contradicts its expectation: give one",
        )
    if values.get("reports_dir") is not None:
        fields["reports_dir"] = values["reports_dir"]
    fields.update(more)
    return RunOptions(**fields)
