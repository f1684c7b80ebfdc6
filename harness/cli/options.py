"""Options defined once, for the command line and the pytest plugin alike.

Each ``Option`` (``harness/core/option.py``) names its destination, its flags, its help and how its
value is read; the CLI verbs (``harness/cli/commands``) and the pytest plugin
(``harness/pytest_plugin.py``) add the ones they take from this table, and ``selection`` turns the
values into ``RunOptions``. The executors' options are their own: each executor declares them
(``harness/pipeline/executors``), and every verb that runs items takes every registered executor's
(``executor_options``). Under pytest, an option whose CLI flag is too generic for a pytest session
that loads many plugins (``--out``, ``--launcher``, ``--repeat``, every executor's...) has a
``repro-`` prefixed flag instead (``pytest_flags``).

Where the matrix comes from: ``--matrix``, else ``./matrix.yaml``, else ``$FT_REGRESS_MATRIX``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from harness.config.locate import DEFAULT_MATRIX_NAME, MATRIX_VARIABLE
from harness.core.errors import UserError
from harness.core.json import JsonValue
from harness.core.option import Option
from harness.core.paths import check_output_dir, check_path
from harness.environments import default_cache_dir
from harness.execution.launchers import LAUNCHERS, default_launcher
from harness.pipeline.executors import EXECUTORS, check_choice, declared_options
from harness.planning.run_options import (
    AttemptPolicy,
    CacheChoice,
    ExecutorChoice,
    RunOptions,
    Selection,
    StackChoice,
    check_repros_dirs,
    load,
)
from harness.planning.shards import parse_shard
from repros.runtime.registry import RegistryClash
from repros.runtime.spec import MODES

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
        Option(
            "cache_dir",
            ("--cache-dir",),
            "where the cells' environments are kept (default: $FT_REGRESS_CACHE, else $XDG_CACHE_HOME/ft-regress, "
            f"else ~/.cache/ft-regress; here: {default_cache_dir()})",
            kind="path",
            pytest_flags=("--repro-cache-dir",),
        ),
        Option(
            "cache_max_gb",
            ("--cache-max-gb",),
            "the environment cache's budget in GB: before a build, the least recently used environments not "
            "in use are removed to fit (default: $FT_REGRESS_CACHE_MAX_GB, else half of what the cache and the "
            "free space of its disk come to)",
            kind="gb",
            metavar="GB",
            pytest_flags=("--repro-cache-max-gb",),
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
            "--ray-address, else a local one), slurm (submitit job arrays, one per cell), or an installed "
            "package's; the options named with an executor below are that executor's own",
            kind="choice",
            choices=EXECUTORS,
            pytest_flags=("--repro-executor",),
        ),
        Option(
            "reruns",
            ("--reruns",),
            "run an item again, up to N times, while its outcome contradicts its "
            "expectation; every attempt is kept, and one that matches on a rerun is reported flaky (default 0)",
            kind="int",
            metavar="N",
            pytest_flags=("--repro-reruns",),
        ),
        Option(
            "pin",
            ("--pin",),
            "pin a package over the selected cells' own spec (repeatable)",
            kind="texts",
            metavar="PKG==VER",
            pytest_flags=("--repro-pin",),
        ),
        Option(
            "shard",
            ("--shard",),
            "run only shard I of N of the planned items, balanced by the durations of the runs in --reports-dir",
            metavar="I/N",
            pytest_flags=("--repro-shard",),
        ),
        Option(
            "as_of",
            ("--as-of",),
            "resolve floating specs (ranges, ~=, *) to what was released before this day (or this UTC time, as a "
            "floating run's rerun commands give it); exact pins stay as written (default: now)",
            kind="date",
            metavar="YYYY-MM-DD",
            pytest_flags=("--repro-as-of",),
        ),
        Option(
            "repeat",
            ("--repeat",),
            "run every selected item N times, each attempt recorded: per item the count of each outcome, "
            "and FLAKY where the attempts disagree (default 1)",
            kind="int",
            metavar="N",
            minimum=1,
            pytest_flags=("--repro-repeat",),
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
            minimum=1,
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


def executor_options() -> dict[str, Option]:
    """Every registered executor's own options, by destination (read from the registry when asked: an
    executor installed or registered later counts), each under pytest with a ``repro-`` prefixed flag.
    One that takes a destination or a flag of the harness's own options is refused in one line."""
    found: dict[str, Option] = {}
    taken = {flag for option in OPTIONS.values() for flag in (*option.flags, *(option.pytest_flags or ()))}
    for dest, declared in declared_options().items():
        option = declared.option
        clash = dest if dest in OPTIONS else next((f for f in option.flags if f in taken), None)
        if clash is not None:
            raise RegistryClash(
                "executor option", EXECUTORS.group or "", clash, "built into ft-regress", declared.executor
            )
        pytest_flags = option.pytest_flags or tuple(f"--repro-{flag.lstrip('-')}" for flag in option.flags)
        found[dest] = dataclasses.replace(option, pytest_flags=pytest_flags)
    return found


def option(name: str) -> Option:
    """The option whose destination is ``name``: the harness's own, or a registered executor's."""
    return OPTIONS[name] if name in OPTIONS else executor_options()[name]


def executor_option_names(jobs: bool = True) -> tuple[str, ...]:
    """``--executor``, every registered executor's own options, ``--launcher``, and ``--jobs`` (where
    items can run at once)."""
    return ("executor", *executor_options(), "launcher", *(("jobs",) if jobs else ()))


def add_cli_options(
    parser: argparse.ArgumentParser, names: Iterable[str], helps: Mapping[str, str] | None = None
) -> None:
    """The options ``names`` on ``parser``; ``helps``: what a verb says of some of them instead (one that
    takes no matrix, say)."""
    for name in names:
        declared = option(name)
        kwargs = declared.argparse_kwargs()
        if helps and name in helps:
            kwargs["help"] = helps[name]
        parser.add_argument(*declared.flags, **kwargs)


def add_executor_options(parser: argparse.ArgumentParser, jobs: bool = True) -> None:
    """Where a verb's items run: ``executor_option_names``, in a group of their own in ``--help``."""
    group = parser.add_argument_group("where items run", "the executor, its own options, the launcher")
    for name in executor_option_names(jobs):
        declared = option(name)
        group.add_argument(*declared.flags, **declared.argparse_kwargs())


def add_pytest_options(group: Any, names: Iterable[str]) -> None:
    """Add the options to a pytest option group, with the ``ft_`` prefix on each destination."""
    for name in names:
        declared = option(name)
        kwargs = declared.argparse_kwargs()
        kwargs["dest"] = f"ft_{declared.dest}"
        if "type" in kwargs and declared.kind in ("path", "paths"):
            kwargs.pop("type")  # pytest paths are resolved against the invocation directory by the plugin
        group.addoption(*(declared.pytest_flags or declared.flags), **kwargs)


def csv(values: Sequence[str] | str | None) -> tuple[str, ...]:
    """Comma-separated values, from one string or several (a repeated option)."""
    if values is None:
        return ()
    if isinstance(values, str):
        values = [values]
    # Only spaces are trimmed ("F1, F5"): any other character is part of the name, and a name
    # with a newline or a tab in it is unknown, not taken for the name without it.
    return tuple(v.strip(" ") for value in values for v in value.split(",") if v.strip(" "))


def parse_pins(texts: Sequence[str] | None) -> tuple[tuple[str, str], ...]:
    """``--pin PKG==VER`` (repeatable): each a canonical name and a version specifier."""
    pins = []
    for text in texts or ():
        try:
            req = Requirement(text)
        except InvalidRequirement:
            raise UserError("--pin", text, "is not a requirement", "write it like deepspeed==0.19.5") from None
        if req.marker or req.extras or req.url or not str(req.specifier):
            raise UserError("--pin", text, "must be a name and a version specifier only", "write it like peft==0.21.2")
        pins.append((canonicalize_name(req.name), str(req.specifier)))
    return tuple(pins)


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


def cache_choice(values: Mapping[str, Any], for_writing: bool = True) -> CacheChoice:
    given = values.get("cache_dir")
    return CacheChoice(
        cache_dir=Path(given).expanduser().resolve() if given is not None else None,
        cache_max_gb=values.get("cache_max_gb"),
        resolved=cache_dir(given, for_writing=for_writing),
    )


def stack_choice(values: Mapping[str, Any]) -> StackChoice:
    """``--pin``, ``--as-of``, ``--model``, ``--world-size`` and ``--family``."""
    world_size = values.get("world_size")
    if world_size is not None and world_size < 1:
        raise UserError(
            "--world-size", str(world_size), "launches no rank", "pass 1 or more (the number of ranks of each item)"
        )
    return StackChoice(
        pins=parse_pins(values.get("pin")),
        as_of=values.get("as_of"),
        model=values.get("model"),
        world_size=values.get("world_size"),
        families=csv(values.get("family")),
    )


def executor_choice(values: Mapping[str, Any], base: ExecutorChoice | None = None) -> ExecutorChoice:
    """``--executor`` and its options, ``--launcher`` and ``--jobs``, over ``base`` (a resumed run's)
    where given; checked before anything runs (``harness.pipeline.executors.check_choice``): the
    executor's package is installed, an option of one executor is not given to another, a cluster
    answers."""
    base = base or ExecutorChoice(launcher=default_launcher())
    name = values.get("executor") or base.name
    given = {dest: _executor_value(declared, values.get(dest)) for dest, declared in executor_options().items()}
    # Every executor option given is kept (its own executor's, or refused naming whose it is by the
    # check below): none is dropped. A resumed run's stand unless given again.
    kept = dict(base.executor_options) if name == base.name else {}
    changes: dict[str, object] = {
        "name": name,
        "executor_options": {**kept, **{dest: value for dest, value in given.items() if value not in (None, [])}},
    }
    if values.get("launcher"):
        changes["launcher"] = values["launcher"]
    if values.get("jobs") is not None:
        changes["jobs"] = values["jobs"]
    choice = base.evolve(**changes)
    check_choice(choice)
    return choice


def _executor_value(declared: Option, value: Any) -> JsonValue:
    """An executor option's value as it reaches the executor (and ``run.json``): a path made absolute,
    comma-separated values split, a repeated option's values in a list."""
    if value is None or value == "" or value == []:
        return None
    if declared.kind == "path":
        return str(Path(value).resolve())
    if declared.kind == "paths":
        return [str(Path(v).resolve()) for v in value]
    if declared.kind == "csv":
        return list(csv(value))
    if declared.kind == "texts":
        return [str(v) for v in value]
    return value if isinstance(value, int | float | bool) else str(value)


def attempt_policy(values: Mapping[str, Any], base: AttemptPolicy | None = None) -> AttemptPolicy:
    """``--repeat`` and ``--reruns``, over ``base`` (a resumed run's) where given."""
    if values.get("repeat") == 0:
        raise UserError("--repeat", "0", "runs nothing", "pass 1 or more (the number of times each item runs)")
    base = base or AttemptPolicy()
    repeat = values.get("repeat")
    reruns = values.get("reruns")
    return AttemptPolicy(
        repeat=base.repeat if repeat is None else repeat, reruns=base.reruns if reruns is None else reruns
    )


def selection(values: Mapping[str, Any], cwd: Path | None = None, **fields: Any) -> RunOptions:
    """``RunOptions`` from option values by destination (the CLI's namespace, or the plugin's): each
    concern parsed once, here. ``fields``: what a command sets itself (``out_dir``, ``explore``...)."""
    if values.get("matrix") is not None:
        check_path("--matrix", Path(values["matrix"]))
    out_dir = fields.get("out_dir")
    if out_dir is not None:
        check_output_dir("--out", Path(out_dir))
    if values.get("reports_dir") is not None and out_dir is None and values.get("out") is None:
        check_output_dir("--reports-dir", Path(values["reports_dir"]))  # where the run's directory is made
    repros_dirs = tuple(check_repros_dirs(values.get("repros_dir") or []))
    matrix, discovery = load(values.get("matrix"), repros_dirs, cwd)
    chosen = Selection(
        lane=values.get("lane"),
        cells=csv(values.get("cells")),
        repros=csv(values.get("repros")),
        modes=csv(values.get("modes")) or MODES,
        repros_dirs=repros_dirs,
        shard=parse_shard(values["shard"]) if values.get("shard") is not None else None,
    )
    if values.get("reports_dir") is not None:
        fields.setdefault("reports_dir", Path(values["reports_dir"]))
    return RunOptions(
        matrix=matrix,
        discovery=discovery,
        selection=chosen,
        stack=stack_choice(values),
        executor=executor_choice(values),
        attempts=attempt_policy(values),
        cache=cache_choice(values),
        **fields,
    )


#: The options of each concern (``harness/planning/run_options.py``), for the verbs that take a whole one.
SELECTION_OPTIONS = ("matrix", "lane", "cells", "repros", "modes", "repros_dir")
#: What chose a run's stack (``StackChoice``): every verb whose items a rerun command names takes them all.
STACK_OPTIONS = ("pin", "as_of", "model", "world_size", "family")
ATTEMPT_OPTIONS = ("repeat", "reruns")
CACHE_OPTIONS = ("cache_dir", "cache_max_gb")
