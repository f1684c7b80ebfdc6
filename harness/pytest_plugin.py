"""pytest plugin: the repros as test items, one per cell x repro x mode.

    pytest repros/ --cells passthrough           # the runner's own stack (a GPU runner)
    pytest --matrix matrix.yaml --lane ci -n 2   # built environments, spread over workers

Options are ``run``'s own (``harness/cli/options.py``), parsed the same way into the same values:
the selection (``--matrix --lane --cells --repros --modes --repros-dir``; ``--cell`` is another
name for ``--cells``), and with a ``--repro-`` prefix where the flag is too generic for a pytest
session that loads many plugins: what chose the stack (``--repro-pin --repro-as-of --repro-model
--repro-world-size --repro-family``), where items run (``--repro-executor``, every registered
executor's own options, prefixed too: ``--repro-ray-address``, ``--repro-slurm-folder
--repro-slurm-param``, an installed executor's; ``--repro-launcher``), how many times (``--repro-repeat
--repro-reruns``), the environment cache (``--repro-cache-dir --repro-cache-max-gb``) and
``--repro-out``. What pytest does itself is left to it: ``-n`` (pytest-xdist) for ``--jobs``, ``-k``
and node ids for a part of the plan; ``--resume``, ``--shard`` and ``--save-expectations`` are
``run``'s only.

Items are planned by ``harness.planning.items.plan_items`` and run by the item runner over the
chosen executor (``harness.pipeline.item_runner``), like ``run``: the same attempts, records,
outcomes and expectations. An item passes when its observation matches its expectation; its
failure shows the outcome, the signature or error, each rank's log tail and the command that
reruns it. Excluded items are skipped with their
reason. Records go to ``<--repro-out>/results.jsonl`` (default: ``reports/pytest-<run-id>``
under the directory pytest was started from) as each item finishes, from every xdist
worker; the session ends with ``harness.reports.finalize`` (``junit.xml``, ``index.html``), so
``report`` and ``compare`` read a pytest run like any run; ``--junitxml`` works as usual.

Repro items are only collected when asked for: one of ``--matrix``, ``--lane``,
``--cells``, ``--repros`` is given, or a path on the command line lies in a repro
directory. Without a path, they replace ``testpaths`` (the harness's own tests).

Markers: ``world_size(n)`` (ranks the item launches) and ``gpus(n)`` (GPUs it needs;
put on repro items where GPUs are visible, one per rank). An item needing more GPUs
than are visible is skipped with the reason. Under pytest-xdist each item leases
its own GPUs for its run (``harness.execution.gpu_lease``, ``CUDA_VISIBLE_DEVICES``), a cell's
items form one ``xdist_group`` (``-n`` alone switches to ``--dist loadgroup``) so a
worker resolves each environment once, and torchrun's ``--standalone`` rendezvous
takes a port the OS picks, so concurrent items never share one.
"""

from __future__ import annotations

import fnmatch
import io
import os
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _pytest._code.code import TracebackStyle
from rich.console import Console

from harness.cli import options
from harness.config.repros import BrokenRepro
from harness.core.errors import UserError
from harness.environments import Environments
from harness.execution.containment import cgroups
from harness.execution.containment.leftovers import sweep_dead_runs
from harness.execution.gpu_lease import visible_gpus
from harness.execution.launchers.supervision import WORKER_PACKAGE_DIR
from harness.pipeline.executors import ExecutorContext, ItemJob, make_executor
from harness.pipeline.item_runner import ItemRunner
from harness.pipeline.observe import broken_record
from harness.pipeline.session import start_meta
from harness.planning.commands import repro_command
from harness.planning.items import Plan, PlannedItem, plan_items
from harness.planning.run_options import RunOptions
from harness.records.item import ItemRecord
from harness.records.results import ResultsWriter
from harness.records.run_dir import RunDir
from harness.records.run_meta import new_run_id, utc_now
from harness.reports.finalize import finalize
from harness.reports.terminal import counts_line, results_table
from repros.runtime.kinds import is_file_ref, kind_of, suffixes
from repros.runtime.measures import measures
from repros.runtime.registry import RegistryClash

STATE = pytest.StashKey["ReproSession"]()
WORKER_INPUT = "ft_regress"


def plugin_options() -> tuple[str, ...]:
    """The options of ``run`` (harness/cli/options.py) the plugin takes: every one that fits a test
    session, every registered executor's own among them (``-n``, pytest-xdist's, runs items at once)."""
    return (
        *options.SELECTION_OPTIONS,
        "out",
        *options.STACK_OPTIONS,
        *options.executor_option_names(jobs=False),
        *options.ATTEMPT_OPTIONS,
        *options.CACHE_OPTIONS,
    )


#: Any of these asks for repro items.
SELECTING_OPTIONS = ("matrix", "lane", "cells", "repros")
#: Lines of each rank's log shown in a failure.
TAIL_LINES = 25


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup(
        "ft-regress repros",
        "ft-regress: the repros as test items, one per cell, repro and mode (the options of ft-regress run)",
    )
    options.add_pytest_options(group, plugin_options())
    parser.addini("ft_regress_reports", "directory for repro runs' output", default="reports")


@dataclass
class ReproSession:
    """What one pytest process (the controller or an xdist worker) knows of the repro run."""

    config: pytest.Config
    opts: RunOptions
    plan: Plan
    run_id: str
    run_dir: RunDir
    is_worker: bool
    gpus: list[str]
    environments: Environments
    writer: ResultsWriter | None = None
    #: This process's item runner over the chosen executor (its launcher: the cells' pre-imported
    #: workers by default), made on first use.
    runner: ItemRunner | None = None

    def item_runner(self) -> ItemRunner:
        if self.runner is None:
            name = os.environ.get("PYTEST_XDIST_WORKER", "controller")
            context = ExecutorContext(
                self.run_dir,
                self.run_id,
                self.opts.executor,
                self.opts.cache,
                self.environments,
                log_dir=self.run_dir.workers_dir / name,
            )
            self.runner = ItemRunner(make_executor(context), self.opts.attempts, self.run_dir)
        return self.runner

    def run(self, item: PlannedItem) -> ItemRecord:
        """The item's record, run as ``run`` runs it (its attempts decided by the item runner)."""
        runner = self.item_runner()
        # The cell's environment is made ready here (once per process), unless the executor's nodes make it.
        resolved = self.environments.for_cell(item.cell) if runner.executor.builds_environments else None
        repros = self.opts.discovery.repros
        command = repro_command(self.opts, item, resolved.env if resolved is not None else None)
        job = ItemJob(self.run_id, item, repros[item.repro_id], command, [r.spec for r in repros.values()])
        record = runner.run(job, resolved)
        assert record is not None, "a test session's runner is never stopped"
        runner.recorded(item)
        return record

    def append(self, record: ItemRecord) -> None:
        if self.writer is None:
            self.writer = self.run_dir.writer()
        self.writer.append(record)

    def repro_files(self) -> dict[Path, str]:
        """Each repro file this run plans items of, by resolved path: the repro id or broken stem."""
        files: dict[Path, str] = {}
        for repro in self.opts.discovery.repros.values():
            files[_module_path(repro.module)] = repro.id
        for stem, broken in self.opts.discovery.broken.items():
            files[_module_path(broken.module)] = stem
        return files


def _module_path(module: str) -> Path:
    if is_file_ref(module):
        return Path(module).resolve()
    return (WORKER_PACKAGE_DIR.parent / Path(*module.split("."))).with_suffix(".py").resolve()


def _repro_dirs(config: pytest.Config) -> list[Path]:
    base = config.invocation_params.dir
    return [WORKER_PACKAGE_DIR, *(Path(base, d).resolve() for d in config.getoption("ft_repros_dir"))]


def _repro_files_given(config: pytest.Config) -> list[Path]:
    """The repro files named on the command line (``pytest repro.yaml``), wherever they lie."""
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        return []
    found = []
    tests = config.getini("python_files")
    for arg in config.args:
        path = Path(config.invocation_params.dir, arg.split("::")[0]).resolve()
        if path.suffix == ".py" and any(fnmatch.fnmatch(path.name, pattern) for pattern in tests):
            continue  # a test module, whatever it assigns
        if path.is_file() and path.suffix in suffixes() and kind_of(path) is not None:
            found.append(path)
    return found


def _asked_for(config: pytest.Config) -> bool:
    if any(config.getoption(f"ft_{name}") for name in SELECTING_OPTIONS):
        return True
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        return False
    if _repro_files_given(config):
        return True
    dirs = _repro_dirs(config)
    for arg in config.args:
        path = Path(config.invocation_params.dir, arg.split("::")[0]).resolve()
        if any(path == d or d in path.parents for d in dirs):
            return True
    return False


def _values(config: pytest.Config) -> dict[str, Any]:
    """The plugin's option values by the shared destinations, paths against the invocation directory; a
    repro file named on the command line is found where it lies (its directory, as ``--repros-dir``)."""
    base = config.invocation_params.dir
    taken = plugin_options()
    values = {name: config.getoption(f"ft_{name}", default=None) for name in taken}
    for name in taken:
        kind = options.option(name).kind
        if kind == "path" and values[name]:
            values[name] = Path(base, values[name])
        elif kind == "paths":
            values[name] = [Path(base, d) for d in values[name] or []]
    given = [path.parent for path in _repro_files_given(config)]
    values["repros_dir"] = list(dict.fromkeys([*values["repros_dir"], *given]))
    return values


def _collected_dirs(config: pytest.Config, state: ReproSession) -> list[str]:
    """Where the planned repros' files are: the worker package's, and each user repro's own directory
    (``--repros-dir``, the matrix's ``repros_dirs``, ``$FT_REGRESS_REPROS``, an installed package)."""
    dirs = [*_repro_dirs(config), *(path.parent for path in state.repro_files())]
    return [str(d) for d in dict.fromkeys(dirs)]


def _options(config: pytest.Config) -> RunOptions:
    # Parsed as `run` parses its own, so each item's repro_cmd is the one `run` writes.
    return options.selection(_values(config), cwd=config.invocation_params.dir)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "world_size(n): the item launches n ranks")
    config.addinivalue_line("markers", "gpus(n): the item needs n GPUs; skipped where fewer are visible")
    # Put on every repro item (a cell's items together under pytest-xdist): known with or without xdist.
    config.addinivalue_line("markers", "xdist_group(name): pytest-xdist runs the items of one group on one worker")
    if not _asked_for(config):
        return
    try:
        opts = _options(config)
        plan = plan_items(opts)
    except UserError as exc:
        raise pytest.UsageError(exc.line()) from None
    except RegistryClash as exc:
        raise pytest.UsageError(str(exc)) from None
    workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
    shared = (workerinput or {}).get(WORKER_INPUT)
    if shared:
        run_id, out = shared["run_id"], Path(shared["out"])
        if shared.get("loadgroup"):
            config.option.loadgroup = True  # xdist's worker then tags each item with its group
    else:
        run_id = new_run_id()
        chosen = config.getoption("ft_out")
        # Records go under the directory pytest was invoked from, never pytest's rootdir.
        base = config.invocation_params.dir
        out = Path(base, chosen) if chosen else base / config.getini("ft_regress_reports") / f"pytest-{run_id}"
        out = out.resolve()
    environments = Environments(opts.cache.path, cache_max_gb=opts.cache.cache_max_gb)
    state = ReproSession(config, opts, plan, run_id, RunDir(out), workerinput is not None, visible_gpus(), environments)
    config.stash[STATE] = state
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args = _collected_dirs(config, state)
    if workerinput is None:
        if getattr(config.option, "dist", "no") == "load" and not any(
            a.startswith("--dist") for a in config.invocation_params.args
        ):
            config.option.dist = "loadgroup"
        if not config.getoption("collectonly"):
            _start_run(state)


def _start_run(state: ReproSession) -> None:
    try:
        state.run_dir = RunDir.create(state.run_dir.path)
    except UserError as exc:
        raise pytest.UsageError(f"{exc.line()} (--repro-out)") from None
    swept = sweep_dead_runs()
    state.run_dir.write_meta(
        start_meta(
            state.opts,
            state.plan,
            state.run_id,
            state.environments,
            state.config.invocation_params.args,
            via="pytest",
            gpus_visible=state.gpus,
            isolation=cgroups.describe(),
            **({"swept_at_start": [swept.as_record()]} if swept else {}),
        )
    )


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist: every worker writes into the controller's run directory."""
    state = node.config.stash.get(STATE, None)
    if state is not None:
        node.workerinput[WORKER_INPUT] = {
            "run_id": state.run_id,
            "out": str(state.run_dir.path),
            "loadgroup": node.config.getoption("dist") == "loadgroup",
        }


_CELL_OF_ITEM = re.compile(r"^(?P<file>[^:]+)::[^:]+\[(?P<cell>[^\]]+)\](?:@.*)?$")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` with the repros: a cell's items go to one worker.

    xdist marks an ``xdist_group`` by suffixing the item's nodeid, which pytest 9 no
    longer lets it change, so the grouping is done here from the item's name
    (``F1-bug[cell]``); every other item is a group of its own.
    """
    state = config.stash.get(STATE, None)
    if state is None or config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    repro_files = {path.name for path in state.repro_files()}

    class CellScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            match = _CELL_OF_ITEM.match(nodeid)
            if match and Path(match["file"]).name in repro_files:
                return f"cell {match['cell']}"
            return nodeid.rsplit("@", 1)[-1] if "@" in nodeid else nodeid

    return CellScheduling(config, log)


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    state = parent.config.stash.get(STATE, None)
    if state is None or file_path.suffix not in suffixes():
        return None
    key = state.repro_files().get(file_path.resolve())
    if key is None:
        return None
    return ReproFile.from_parent(parent, path=file_path, key=key)


class ReproFile(pytest.File):
    """A repro file (a module, or a script repro's declaration): its items in every planned cell and
    mode (never imported by pytest)."""

    def __init__(self, *, key: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.key = key

    def collect(self) -> Iterator[pytest.Item]:
        state = self.config.stash[STATE]
        for planned in state.plan.items:
            if planned.repro_id == self.key:
                yield ReproItem.from_parent(
                    self, name=f"{planned.repro_id}-{planned.mode}[{planned.cell.name}]", planned=planned
                )
        for excluded in state.plan.excluded:
            if excluded.repro == self.key:
                yield SkippedItem.from_parent(
                    self,
                    name=f"{excluded.repro}-{excluded.mode}[{excluded.cell}]",
                    reason=excluded.reason,
                    label=excluded.label,
                )
        for cell, broken in state.plan.broken:
            if broken.id == self.key:
                yield BrokenItem.from_parent(self, name=f"{broken.id}-bug[{cell.name}]", cell=cell, broken=broken)


class ReproMismatch(Exception):
    """The observation did not match the expectation; the record says how."""

    def __init__(self, record: ItemRecord) -> None:
        super().__init__(record.outcome)
        self.record = record


def _last_lines(text: str, limit: int = TAIL_LINES) -> str:
    lines = text.rstrip().splitlines()
    shown = lines[-limit:]
    return "\n".join(("    " + ln) for ln in shown) + ("\n    …" if len(lines) > limit else "")


#: ``run``'s flags as the plugin spells them (``--pin`` is ``--repro-pin`` here).
PYTEST_FLAGS = {o.flags[0]: o.pytest_flags[0] for o in options.OPTIONS.values() if o.pytest_flags}


def rerun_with_pytest(node: str, repro_cmd: str) -> str:
    """The pytest command that reruns the item ``node`` (its file and name) alone, with the options its
    ``repro_cmd`` (``ft-regress run ...``) gives it, as the plugin spells them."""
    words = shlex.split(repro_cmd)
    if "run" not in words:
        return repro_cmd
    flags = words[words.index("run") + 1 :]
    return shlex.join(["pytest", node, *(PYTEST_FLAGS.get(word, word) for word in flags)])


def failure_text(record: ItemRecord, node: str | None = None) -> str:
    """What a pytest failure shows: the outcome against the expectation, the signature
    or error, the reasons, each rank's log tail, and how to rerun the item alone (with pytest, the
    item ``node``, where it is known)."""
    expected = record.expected or "nothing (no expectation covers these versions)"
    lines = [f"{record.id.label()}: observed {record.outcome}, expected {expected}"]
    lines.append(f"signature: {record.signature or '(none observed)'}")
    error = record.error
    if error:
        rank = f" (rank {error.rank})" if error.rank is not None else ""
        lines.append(f"error: {error.type}: {error.message}{rank}")
    lines += [f"reason: {reason}" for reason in record.reasons]
    lines.append("versions: " + " ".join(f"{k}={v}" for k, v in record.versions.items() if v))
    for rank_summary in record.ranks:
        code = f", exit code {rank_summary.exitcode}" if rank_summary.exitcode is not None else ""
        lines.append(f"rank {rank_summary.rank} ({rank_summary.status}{code}) log tail:")
        lines.append(_last_lines(rank_summary.log_tail or "(empty)"))
    if not record.ranks and record.launcher_tail:
        lines.append("launcher log tail:")
        lines.append(_last_lines(record.launcher_tail))
    lines.append(f"rerun: {rerun_with_pytest(node, record.repro_cmd) if node else record.repro_cmd}")
    if record.item_dir:
        lines.append(f"logs: {record.item_dir}")
    return "\n".join(lines)


class _RecordedItem(pytest.Item):
    record: ItemRecord | None = None

    def _finish(self, state: ReproSession, record: ItemRecord) -> None:
        state.append(record)
        self.record = record
        # Plain values only: xdist sends them between processes (execnet takes built-in types).
        expected = str(record.expected) if record.expected is not None else None
        for name, value in (
            ("outcome", str(record.outcome)),
            ("expected", expected),
            ("signature", record.signature),
            ("matched", record.matched),
            ("wall_s", record.wall_s),
        ):
            self.user_properties.append((name, value))
        for measure in measures():
            figure = record.figure(measure.name)
            if figure is not None and figure.value is not None:
                self.user_properties.append((measure.field, figure.value))
        if os.environ.get("PYTEST_XDIST_WORKER"):
            self.user_properties.append(("xdist_worker", os.environ["PYTEST_XDIST_WORKER"]))
        if record.counts_against:
            raise ReproMismatch(record)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: TracebackStyle | None = None) -> str:
        if isinstance(excinfo.value, ReproMismatch):
            return failure_text(excinfo.value.record, f"{self.path}::{self.name}")
        return str(super().repr_failure(excinfo))


class ReproItem(_RecordedItem):
    def __init__(self, *, planned: PlannedItem, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.planned = planned
        self.add_marker(pytest.mark.world_size(planned.world_size))
        if self.config.stash[STATE].gpus:
            self.add_marker(pytest.mark.gpus(planned.world_size))
        self.add_marker(pytest.mark.xdist_group(planned.cell.name))

    def runtest(self) -> None:
        state = self.config.stash[STATE]
        self._finish(state, state.run(self.planned))

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, 0, self.planned.id.label()


class BrokenItem(_RecordedItem):
    """A repro file that cannot be loaded: INFRA in each cell, as ``run`` records it."""

    def __init__(self, *, cell: Any, broken: BrokenRepro, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cell = cell
        self.broken = broken
        self.add_marker(pytest.mark.xdist_group(cell.name))

    def runtest(self) -> None:
        state = self.config.stash[STATE]
        self._finish(state, broken_record(state.run_id, self.cell, self.broken))

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, 0, f"{self.cell.name}/{self.broken.id}/bug"


class SkippedItem(pytest.Item):
    """An item the matrix excludes, skipped with its reason."""

    def __init__(self, *, reason: str, label: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.label = label
        self.add_marker(pytest.mark.skip(reason=f"excluded: {reason}"))

    def reportinfo(self) -> tuple[Path, int | None, str]:
        # A line is needed for a skip reported at the item's location.
        return self.path, 0, self.label

    def runtest(self) -> None:  # pragma: no cover - always skipped
        pass


def pytest_runtest_setup(item: pytest.Item) -> None:
    """``gpus(n)``: skip where fewer than n GPUs are visible (any item, not only repros)."""
    marker = item.get_closest_marker("gpus")
    if marker is None:
        return
    needed = int(marker.args[0]) if marker.args else 1
    state = item.config.stash.get(STATE, None)
    visible = state.gpus if state is not None else visible_gpus()
    if needed > len(visible):
        pytest.skip(f"needs {needed} GPUs, {len(visible)} visible")


def pytest_sessionfinish(session: pytest.Session) -> None:
    state = session.config.stash.get(STATE, None)
    if state is None:
        return
    if state.writer is not None:
        state.writer.close()
        state.writer = None
    if state.runner is not None:
        state.runner.executor.close()
    if state.is_worker or session.config.getoption("collectonly") or not state.run_dir.meta_path.exists():
        return
    meta = state.run_dir.read_meta()
    state.run_dir.write_meta(meta.evolve(finished_at=utc_now(), pytest_exitstatus=int(session.exitstatus)))
    finalize(state.run_dir)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    state = config.stash.get(STATE, None)
    if state is None or state.is_worker or config.getoption("collectonly"):
        return
    records = state.run_dir.records()
    if not records:
        return
    buffer = io.StringIO()
    Console(file=buffer, width=160, soft_wrap=True, color_system=None).print(
        results_table(records, state.plan.excluded)
    )
    terminalreporter.write_sep("=", "ft-regress: outcome (✓ matches expectation) · peak memory · step time")
    terminalreporter.write(buffer.getvalue())
    terminalreporter.write_line(f"{counts_line(records)}; results: {state.run_dir.results_path}")
