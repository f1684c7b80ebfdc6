"""A stand-in stack for end-to-end tests of the orchestrator that need no torch.

``install(root)`` writes a fake ``torch`` distribution (so a ``passthrough`` cell on
the orchestrator's own interpreter resolves) whose ``torch.distributed.run`` starts
one process per rank; each rank loads the repro module, calls ``run(ctx)`` and writes
its rank record the way ``repros.runtime.rank_main`` does, plus what it saw of
``CUDA_VISIBLE_DEVICES`` and when it ran. A whole item takes a fraction of a second,
so real ``run``, ``merge`` and ``pytest`` sessions over many items stay cheap.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import yaml

from harness.environments import Environment

FAKE_TORCHRUN = """
import argparse, os, subprocess, sys
parser = argparse.ArgumentParser()
parser.add_argument("--standalone", action="store_true")
parser.add_argument("--nnodes")
parser.add_argument("--nproc_per_node", type=int)
parser.add_argument("--max_restarts")
parser.add_argument("-m", dest="entry")
args, rest = parser.parse_known_args()
ranks = [
    subprocess.Popen([sys.executable, os.environ["FAKE_RANK"], *rest],
                     env=dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(args.nproc_per_node)))
    for r in range(args.nproc_per_node)
]
codes = [p.wait() for p in ranks]
for r, c in enumerate(codes):
    if c:
        print(f"[0]:\\n  rank      : {r}\\n  exitcode  : {c}")
sys.exit(1 if any(codes) else 0)
"""

FAKE_RANK = """
import argparse, json, os, sys, time, traceback, types
from pathlib import Path
from repros.runtime.loading import load_repro
from repros.runtime.record import write_rank_record
parser = argparse.ArgumentParser()
parser.add_argument("--module")
parser.add_argument("--mode")
parser.add_argument("--item-dir", type=Path)
parser.add_argument("--params", default="{}")
args = parser.parse_args()
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
record = {"rank": rank, "world_size": world, "pid": os.getpid(), "mode": args.mode, "status": "running",
          "phase": "run", "device": "cpu", "backend": "fake",
          "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "t_start": time.time()}
write_rank_record(args.item_dir, rank, record)
code = 0
try:
    ctx = types.SimpleNamespace(rank=rank, world_size=world, mode=args.mode, facts={}, params=json.loads(args.params))
    load_repro(args.module, json.loads(args.params)).run(ctx)
    record["status"] = "ok"
except BaseException as exc:
    cls = type(exc)
    name = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    bases = [b.__qualname__ if b.__module__ == "builtins" else f"{b.__module__}.{b.__qualname__}"
             for b in cls.__mro__[1:] if b is not object]
    record.update(status="error", error={"type": name, "bases": bases, "message": str(exc),
                                         "traceback": traceback.format_exc()})
    print(traceback.format_exc(), file=sys.stderr)
    code = 1
record.update(t_end=time.time(), measures={"peak_mem": {"kind": "cpu_peak_rss", "value": 1 << 20}}, facts=ctx.facts)
write_rank_record(args.item_dir, rank, record)
sys.exit(code)
"""

#: A repro for the stand-in stack: ``BEHAVIOUR`` is "raise" (the signature), "clean", "other", or
#: "flaky" ("other" the first time each rank runs it, from the repro's directory, then "raise").
REPRO = """
import time
from pathlib import Path
from repros.runtime.spec import Expectation, ReproSpec, Signature

SPEC = ReproSpec(
    id={id!r},
    title="stand-in repro {id}",
    upstream=(),
    signatures=(Signature(id="{id}.sig", exception="ValueError", pattern="documented symptom"),),
    expectations=(Expectation(mode="bug", outcome={expected!r}),),
    modes=("bug",),
    world_size={world_size!r},
)


def run(ctx):
    time.sleep({sleep!r})
    ctx.facts["params"] = ctx.params  # what the orchestrator told the rank (the model's family, size...)
    behaviour = {behaviour!r}
    if behaviour == "flaky":
        ran = Path(__file__).with_name(".{id}.rank%d.ran" % ctx.rank)
        behaviour = "raise" if ran.exists() else "other"
        ran.touch()
    if behaviour == "chatty":
        print("\\n".join("line %d of a chatty repro's log" % i for i in range(200)), flush=True)
    if behaviour == "raise":
        raise ValueError("the documented symptom, on rank %d" % ctx.rank)
    if behaviour == "other":
        raise KeyError("something else")
"""


def install(root: Path) -> dict[str, str]:
    """Write the fake torch under ``root``; return the environment variables that enable it."""
    site = root / "fake-site"
    (site / "torch" / "distributed").mkdir(parents=True, exist_ok=True)
    (site / "torch" / "__init__.py").write_text("")
    (site / "torch" / "distributed" / "__init__.py").write_text("")
    (site / "torch" / "distributed" / "run.py").write_text(textwrap.dedent(FAKE_TORCHRUN))
    info = site / "torch-2.13.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0\n")
    rank = root / "fake_rank.py"
    rank.write_text(textwrap.dedent(FAKE_RANK))
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "FAKE_RANK": str(rank)}


def write_repro(
    directory: Path, repro_id: str, behaviour: str, expected: str, *, world_size: int | None = None, sleep: float = 0.0
) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    text = REPRO.format(id=repro_id, behaviour=behaviour, expected=expected, world_size=world_size, sleep=sleep)
    (directory / f"{repro_id.lower()}_fake.py").write_text(textwrap.dedent(text))


def write_matrix(path: Path, cells: list[str], lane: str = "t", extra: dict[str, Any] | None = None) -> Path:
    matrix = {
        "version": 1,
        "default_lane": lane,
        "lanes": {lane: "stand-in lane"},
        "defaults": {"world_size": 2, "timeout_s": 60},
        "cells": {name: {"passthrough": True, "lanes": [lane]} for name in cells},
        **(extra or {}),
    }
    path.write_text(yaml.safe_dump(matrix, sort_keys=False))
    return path


def run_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS"}}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    # The stand-in stack fakes torchrun, not a cell's pre-imported worker.
    env["FT_REGRESS_LAUNCHER"] = "torchrun"
    env.update(extra)
    return env


def rank_records(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((run_dir / "items").glob("*/*/rank*.json"))]


def this_interpreter(key: str, extensions_dir: Path) -> Environment:
    """An environment record for the orchestrator's own interpreter, for launch tests with no torch."""
    return Environment(
        key=key,
        python=sys.executable,
        python_version="3.11",
        packages={},
        path=None,
        extensions_dir=str(extensions_dir),
        reused=True,
        build_s=0.0,
        provider="passthrough",
    )
