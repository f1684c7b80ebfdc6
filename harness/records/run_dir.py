"""A run's directory: its layout, its ``run.json``, its records, and its lock.

```
<run dir>/
  results.jsonl        one record per item (harness/records/results.py)
  run.json             the run: options, provenance, cells, plan (``RunMeta``)
  cells.jsonl          while a run writes: each cell's environment as it was made ready
  junit.xml, index.html   written by ``harness.reports.finalize`` from the two above
  items/<cell>/<repro>-<mode>/   each item's rank records and logs
  workers/             the cells' pre-imported workers' logs
  .lock                held while a run writes here
```

Every command that writes a run directory goes through ``RunDir``: nothing else names these
files. ``run.json`` is replaced atomically; a run directory holds one run, locked while it is
written, so a ``--resume`` of a live run, or two runs into one ``--out``, are refused.

A run writes ``run.json`` as it starts and as it ends (an interrupt included), never per cell: a
run of many cells would rewrite an ever larger file once a cell. Each cell's environment is
appended to ``cells.jsonl`` instead as it is made ready (one line each), and ``read_meta`` adds
the cells ``run.json`` does not hold yet from there, so a run killed outright keeps them too; once
``run.json`` holds every cell the run ends by removing it.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import ValidationError

from harness.core.errors import UserError
from harness.core.user_files import read_named_text
from harness.records.item import ItemId, validation_problem
from harness.records.results import RESULTS_FILE, Records, ResultsWriter, read_results
from harness.records.run_meta import CellMeta, RunMeta

#: A file written beside its final name and renamed into place (``NAME.tmp``, ``NAME.tmp<pid>``).
_PARTIAL = re.compile(r"\.tmp\d*$")
RUN_FILE = "run.json"
#: The largest run.json read (its cells and their locks; items are in results.jsonl).
MAX_META_BYTES = 256 * 2**20
CELLS_FILE = "cells.jsonl"
LOCK_FILE = ".lock"
ITEMS_DIR = "items"
WORKERS_DIR = "workers"


def _safe_part(text: str, what: str) -> str:
    if not text or text in (".", "..") or "/" in text or "\0" in text or os.sep in text:
        raise ValueError(f"{what} {text!r} cannot name a directory")
    return text


class RunDir:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    # -- layout ------------------------------------------------------------------------
    @property
    def results_path(self) -> Path:
        return self.path / RESULTS_FILE

    @property
    def meta_path(self) -> Path:
        return self.path / RUN_FILE

    @property
    def cells_path(self) -> Path:
        return self.path / CELLS_FILE

    @property
    def workers_dir(self) -> Path:
        return self.path / WORKERS_DIR

    def item_dir(self, item: ItemId) -> Path:
        """Where one item's ranks write (absolute: ranks run in another directory)."""
        cell = _safe_part(item.cell, "cell")
        name = _safe_part(f"{item.repro}-{item.mode}", "repro")
        return (self.path / ITEMS_DIR / cell / name).resolve()

    # -- creating and opening ----------------------------------------------------------
    @classmethod
    def create(cls, path: Path) -> RunDir:
        """A new run directory: it may exist, but must be empty (hidden entries aside) and hold no
        run. A run writes its reports (``index.html``, ``junit.xml``...) into it: a folder of the
        user's own is never written over."""
        run = cls(path)
        held = run.held_file()
        if held is not None:
            raise UserError(path, held, "already holds the results of another run", "choose a new --out directory")
        if (run.path / LOCK_FILE).exists():
            run._refuse_if_locked()
        others = run._entries_of_its_own()
        if others:
            shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
            raise UserError(
                path,
                "--out",
                f"is not empty and holds no run ({shown}): the run's reports would be written over what is there",
                "give --out a new or empty directory",
            )
        try:
            run.path.mkdir(parents=True, exist_ok=True)
            probe = run.path / ".write-test"
            probe.write_text("")
            probe.unlink()
        except OSError as exc:
            raise UserError(
                path, "--out", f"cannot be written ({exc.strerror})", "choose a directory you can write to"
            ) from None
        return run

    def held_file(self) -> str | None:
        """The file that says a run is here (``results.jsonl``, else ``run.json``), or None: what a
        refusal to write over it names."""
        return next((p.name for p in (self.results_path, self.meta_path) if p.exists()), None)

    def _entries_of_its_own(self) -> list[str]:
        """What a directory holds that no run put there (hidden entries, a run's lock, aside)."""
        try:
            return sorted(entry.name for entry in os.scandir(self.path) if not entry.name.startswith("."))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError:
            return []

    @classmethod
    def existing(cls, path: Path) -> RunDir:
        """The directory of an earlier run (``report``, ``--resume``, ``compare``, ``merge``)."""
        run = cls(path)
        if not run.path.is_dir():
            raise UserError(path, "", "is not a directory", "pass the directory of a run (reports/<run-id>)")
        if not run.results_path.is_file() and not run.meta_path.is_file():
            raise UserError(
                path,
                "",
                f"holds no run (neither {RESULTS_FILE} nor {RUN_FILE})",
                "pass the directory of a run (reports/<run-id>)",
            )
        return run

    # -- run.json ------------------------------------------------------------------------
    def read_meta(self, required: bool = False) -> RunMeta:
        """``run.json``, validated (an empty one where there is none and it is not required)."""
        if not os.path.lexists(self.meta_path):
            if required:
                raise UserError(self.path, RUN_FILE, "is missing", "pass the directory of an ft-regress run")
            return RunMeta()
        text = read_named_text(self.meta_path, "", "restore it from the run", limit=MAX_META_BYTES, what="a run.json")
        try:
            meta = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UserError(self.meta_path, f"line {exc.lineno}", "is not JSON", "restore it from the run") from None
        except (ValueError, RecursionError):
            # Nested too deep, or a number of more digits than Python reads.
            raise UserError(self.meta_path, "", "is not JSON this harness reads", "restore it from the run") from None
        if not isinstance(meta, dict):
            raise UserError(
                self.meta_path, "", f"is a JSON {type(meta).__name__}, not an object", "restore it from the run"
            )
        try:
            found = RunMeta.model_validate(meta)
        except ValidationError as exc:
            raise UserError(self.meta_path, "", validation_problem(exc), "restore it from the run") from None
        appended = {name: cell for name, cell in self.appended_cells().items() if name not in found.cells}
        return found.evolve(cells={**found.cells, **appended}) if appended else found

    def append_cell(self, name: str, cell: CellMeta) -> None:
        """Add a cell's environment to ``cells.jsonl`` (a line, written whole and flushed)."""
        line = json.dumps({"cell": name, "meta": cell.model_dump(mode="json", exclude_unset=True)}, sort_keys=True)
        with open(self.cells_path, "a", encoding="utf-8") as fh:
            if fh.tell() and not self._ends_with_newline():
                fh.write("\n")  # a line cut short by a killed run stays a line of its own, skipped
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def _ends_with_newline(self) -> bool:
        with open(self.cells_path, "rb") as fh:
            fh.seek(-1, os.SEEK_END)
            return fh.read(1) == b"\n"

    def appended_cells(self) -> dict[str, CellMeta]:
        """The cells in ``cells.jsonl``, the last line of each; a line that is not one is skipped."""
        try:
            lines = self.cells_path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return {}
        cells: dict[str, CellMeta] = {}
        for line in lines:
            try:
                entry = json.loads(line)
                cells[str(entry["cell"])] = CellMeta.model_validate(entry["meta"])
            except (ValueError, RecursionError, KeyError, TypeError, ValidationError):
                continue  # a torn or damaged line: run.json, written at the end, has the cells whole
        return cells

    def clear_appended_cells(self) -> None:
        """``run.json`` holds every cell now: ``cells.jsonl`` goes."""
        self.cells_path.unlink(missing_ok=True)

    def write_meta(self, meta: RunMeta) -> None:
        """Replace ``run.json`` atomically: the one place it is written."""
        tmp = self.path / f"{RUN_FILE}.tmp{os.getpid()}"
        tmp.write_text(json.dumps(meta.as_json(), indent=1, sort_keys=True), encoding="utf-8")
        os.replace(tmp, self.meta_path)

    def remove_partial_writes(self) -> list[Path]:
        """Remove what writes cut short by a killed run left (``run.json.tmp<pid>``, ``index.html.tmp``,
        a rank's ``rank0.json.tmp<pid>``): nothing reads them, and a resumed run finishes whole. Only
        while the directory is held (``locked``): no writer of its own is alive then."""
        found = [p for p in self.path.glob("*.tmp*") if _PARTIAL.search(p.name)]
        found += [p for p in self.path.glob(f"{ITEMS_DIR}/*/*/*.tmp*") if _PARTIAL.search(p.name)]
        found += [p for p in self.path.glob(f"{ITEMS_DIR}/*/*/.*.tmp") if _PARTIAL.search(p.name)]
        removed = []
        for partial in found:
            try:
                if partial.is_file() and not partial.is_symlink():
                    partial.unlink()
                    removed.append(partial)
            except OSError:
                continue
        return removed

    # -- records -------------------------------------------------------------------------
    def records(self) -> Records:
        """The run's records, each item once (``Records.duplicates`` says where one was repeated)."""
        return read_results(self.results_path) if self.results_path.exists() else Records()

    def writer(self) -> ResultsWriter:
        return ResultsWriter(self.results_path)

    # -- lock ----------------------------------------------------------------------------
    def _refuse_if_locked(self) -> None:
        """A live run holds this directory (it may not have written anything yet)."""
        with self.locked():
            pass

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the run directory for as long as a command writes it; refuse a second writer."""
        self.path.mkdir(parents=True, exist_ok=True)
        with open(self.path / LOCK_FILE, "a+") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip() or "another process"
                raise UserError(
                    self.path,
                    LOCK_FILE,
                    f"is in use by a live run ({holder})",
                    "wait for it to end, or use another directory",
                ) from None
            handle.seek(0)
            handle.truncate()
            handle.write(f"pid {os.getpid()}\n")
            handle.flush()
            try:
                yield
            finally:
                handle.seek(0)
                handle.truncate()
                fcntl.flock(handle, fcntl.LOCK_UN)
