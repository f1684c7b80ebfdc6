"""``python -m repros.runtime.describe FILE --out JSON``: read a user's repro, in a process of its own.

The orchestrator never imports a user's repro file: whatever the file does at import (exit the
process, change directory, print, loop) happens here, in a child it can time out, and what
comes back is the ``SPEC`` as data, or why there is none. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path

from repros.runtime.kinds import kind_of
from repros.runtime.kinds.script import DeclarationError, declared_id
from repros.runtime.spec import spec_to_data


def describe(path: str) -> dict[str, object]:
    kind = kind_of(Path(path))
    if kind is None:
        return {"ok": False, "error": "declares no repro"}
    try:
        loaded = kind.load(path)
    except DeclarationError as exc:
        # The loader's own words, in parts, and the id the file means to declare: a matrix that names
        # it is told what is wrong with the file rather than that no such repro exists.
        return {
            "ok": False,
            "error": f"is not a usable repro declaration: {exc}",
            "declaration_error": exc.parts,
            "declared_id": declared_id(Path(path)),
        }
    except BaseException as exc:  # noqa: BLE001 - a user's file may fail in any way
        return {
            "ok": False,
            "error": f"cannot be imported: {type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(),
        }
    return {"ok": True, "kind": kind.name, "spec": spec_to_data(loaded.spec), "rank_params": loaded.rank_params}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("file")
    parser.add_argument("--out", required=True, help="where the description goes (the file may print anything)")
    args = parser.parse_args(argv)
    result = describe(args.file)
    tmp = f"{args.out}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(result, fh, default=str)
    os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
