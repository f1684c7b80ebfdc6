"""Run a user's training script in a rank, as torchrun would have run it. Standard library only.

The rank already has torchrun's environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``/``MASTER_PORT``...). The script runs in this process (so its exception is
recorded with its type, message and traceback, and matched like any repro's) with
``__name__ == "__main__"``, ``sys.argv`` its declared command line, its own directory first on
``sys.path`` (a helper module beside it imports), its declared working directory (default: its
own), and its declared variables. ``sys.exit(0)`` (or none) is a clean end; any other exit
status is an error (``SystemExit``). It sets up ``torch.distributed`` itself.
"""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Mapping
from typing import Any


def command_for(declared: Mapping[str, Any], mode: str) -> Mapping[str, Any]:
    """The command a mode runs: the script as declared, or in ``fixed`` mode its workaround."""
    if mode == "fixed":
        fixed = declared.get("fixed")
        if not isinstance(fixed, Mapping) or not fixed:
            raise ValueError(f"{declared.get('id')} declares no fixed command")
        return fixed
    command = declared["command"]
    if not isinstance(command, Mapping):
        raise ValueError(f"{declared.get('id')} declares no command")
    return command


def run_script(declared: Mapping[str, Any], ctx: Any) -> None:
    command = command_for(declared, ctx.mode)
    script = str(command["path"])
    ctx.facts["script"] = {"path": script, "args": list(command["args"]), "cwd": command["cwd"]}
    os.environ.update({str(k): str(v) for k, v in dict(command.get("env") or {}).items()})
    saved_argv, saved_path, saved_cwd = sys.argv, list(sys.path), os.getcwd()
    sys.argv = [script, *command["args"]]
    sys.path.insert(0, os.path.dirname(script))
    os.chdir(command["cwd"])
    print(f"ft-regress: running {' '.join([script, *command['args']])} in {command['cwd']}", flush=True)
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        os.chdir(saved_cwd)
