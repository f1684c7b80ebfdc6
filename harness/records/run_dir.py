"""A run's directory: its layout, its ``run.json``, its records, and its lock.

```
<run dir>/
  results.jsonl        one record per item (harness/records/results.py)
  run.json             the run: options, provenance, cells, plan (``RunMeta``)
  junit.xml, index.html   written by ``harness.reports.finalize`` from the two above
  items/<cell>/<repro>-<mode>/   each item's rank records and logs
  workers/             the cells' pre-imported workers' logs
  .lock                held while a run writes here
```

Every command that writes a run directory goes through ``RunDir``: nothing else names these
files. ``run.json`` is replaced atomically; a run directory holds one run, locked while it is
written, so a ``--resume`` of a live run, or two runs into one ``--out``, are refused.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import ValidationError

from harness.core.errors import UserError
from harness.records.item import ItemId, ItemRecord, validation_problem
from harness.records.results import RESULTS_FILE, ResultsWriter, read_results
from harness.records.run_meta import RunMeta

RUN_FILE = "run.json"
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
        """A new run directory (it may exist, but must hold no run's results)."""
        run = cls(path)
        if run.results_path.exists() or run.meta_path.exists():
            raise UserError(
                path, RESULTS_FILE, "already holds the results of another run", "choose a new --out directory"
            )
        if (run.path / LOCK_FILE).exists():
            run._refuse_if_locked()
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

    @classmethod
    def existing(cls, path: Path) -> RunDir:
        """The directory of an earlier run (``report``, ``--resume``, ``compare``, ``merge``)."""
        run = cls(path)
        if not run.path.is_dir():
            raise UserError(path, "", "is not a directory", "pass the directory of a run (reports/<run-id>)")
        if not run.results_path.is_file() and not run.meta_path.is_file():
            raise UserError(path, RESULTS_FILE, "no results here", "pass the directory of a run (reports/<run-id>)")
        return run

    # -- run.json ------------------------------------------------------------------------
    def read_meta(self, required: bool = False) -> RunMeta:
        """``run.json``, validated (an empty one where there is none and it is not required)."""
        try:
            text = self.meta_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            if required:
                raise UserError(self.path, RUN_FILE, "is missing", "pass the directory of an ft-regress run") from None
            return RunMeta()
        except (IsADirectoryError, UnicodeDecodeError, OSError) as exc:
            raise UserError(self.meta_path, "", f"cannot be read ({exc})", "restore it from the run") from None
        try:
            meta = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UserError(self.meta_path, f"line {exc.lineno}", "is not JSON", "restore it from the run") from None
        if not isinstance(meta, dict):
            raise UserError(
                self.meta_path, "", f"is a JSON {type(meta).__name__}, not an object", "restore it from the run"
            )
        try:
            return RunMeta.model_validate(meta)
        except ValidationError as exc:
            raise UserError(self.meta_path, "", validation_problem(exc), "restore it from the run") from None

    def write_meta(self, meta: RunMeta) -> None:
        """Replace ``run.json`` atomically: the one place it is written."""
        tmp = self.path / f"{RUN_FILE}.tmp{os.getpid()}"
        tmp.write_text(json.dumps(meta.as_json(), indent=1, sort_keys=True), encoding="utf-8")
        os.replace(tmp, self.meta_path)

    # -- records -------------------------------------------------------------------------
    def records(self) -> list[ItemRecord]:
        return read_results(self.results_path) if self.results_path.exists() else []

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
